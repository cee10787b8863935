"""The stepscope lines each program adds, exactly as the README's quick starts say, in two
capture configurations:

- `oneliner`: the hook or callback with its defaults (`Hook(out_dir)`,
  `Trainer(callbacks=[StepscopeCallback(out_dir)])` for Lightning and for the Hugging Face
  Trainer, Keras' `callbacks=[StepscopeCallback(out_dir)]`);
- `quickstart`: the README's quick-start configuration (PyTorch, Lightning and the Hugging Face Trainer: weights,
  biases, gradients, losses and outputs every 100 steps, losses every step; Keras: weights,
  gradients and layer outputs every 100 steps, losses every step).

Only these functions know the configurations, so a program reads like its original with a
hook added."""

from __future__ import annotations

CONFIGS = ("oneliner", "quickstart")


def _check(config: str) -> None:
    if config not in CONFIGS:
        raise ValueError(f"capture config must be one of {CONFIGS}, got {config!r}")


def _torch_quickstart() -> dict:
    from stepscope.config import Collection, SaveConfig

    return dict(
        save_config=SaveConfig(save_interval=100),
        include_collections=["weights", "biases", "gradients", "losses", "outputs"],
        collections=[Collection("losses", save_config=SaveConfig(save_interval=1))],
    )


def torch_hook(out_dir, config: str):
    """A plain-loop `stepscope_torch.Hook` (use it as a context manager)."""
    from stepscope_torch import Hook

    _check(config)
    return Hook(str(out_dir)) if config == "oneliner" else Hook(str(out_dir), **_torch_quickstart())


def lightning_callback(out_dir, config: str):
    """`stepscope_torch.StepscopeCallback` for `Trainer(callbacks=[...])`."""
    from stepscope_torch import StepscopeCallback

    _check(config)
    return StepscopeCallback(str(out_dir)) if config == "oneliner" else StepscopeCallback(str(out_dir), **_torch_quickstart())


def hf_callback(out_dir, config: str):
    """`stepscope_torch.hf.StepscopeCallback` for `transformers.Trainer(callbacks=[...])`."""
    from stepscope_torch.hf import StepscopeCallback

    _check(config)
    return StepscopeCallback(str(out_dir)) if config == "oneliner" else StepscopeCallback(str(out_dir), **_torch_quickstart())


def keras_callback(out_dir, config: str):
    """`stepscope_tf.StepscopeCallback` for `model.fit(..., callbacks=[...])`."""
    from stepscope_tf import Collection, SaveConfig, StepscopeCallback

    _check(config)
    if config == "oneliner":
        return StepscopeCallback(str(out_dir))
    return StepscopeCallback(
        str(out_dir), save_config=SaveConfig(save_interval=100), include_collections=["weights", "gradients", "outputs"],
        collections=[Collection("losses", save_config=SaveConfig(save_interval=1))],
    )


__all__ = ["CONFIGS", "torch_hook", "lightning_callback", "hf_callback", "keras_callback"]
