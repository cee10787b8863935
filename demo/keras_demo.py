"""The Keras part of the demo job: a small model trained on synthetic data on the CPU with
StepscopeCallback through fit (with validation), evaluate and predict, then what was saved,
read back with stepscope.create_trial. `run(out_root)` returns the job folders it wrote."""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def run(out_root: str) -> list[str]:
    import keras
    import numpy as np

    import stepscope
    from stepscope.config import SaveConfig
    from stepscope.modes import ModeKeys
    from stepscope_tf import StepscopeCallback

    started = time.perf_counter()
    out_dir = os.path.join(out_root, "keras_job")
    rng = np.random.RandomState(0)
    x = rng.randn(512, 16).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32")  # a learnable binary label

    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,), name="features")
    hidden = keras.layers.Dense(32, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(2, name="logits")(hidden)
    model = keras.Model(inputs, outputs, name="demo")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

    with StepscopeCallback(
        out_dir,
        save_config=SaveConfig(save_interval=5),
        include_collections=["weights", "biases", "gradients", "optimizer_variables"],
        include_regex=[r"outputs/logits$"],
    ) as callback:
        model.fit(x[:384], y[:384], validation_data=(x[384:], y[384:]), batch_size=32, epochs=3, verbose=0, callbacks=[callback])
        model.evaluate(x[384:], y[384:], batch_size=32, verbose=0, callbacks=[callback])
        model.predict(x[384:], batch_size=32, verbose=0, callbacks=[callback])

    trial = stepscope.create_trial(out_dir)
    print(f"keras demo: {out_dir} ({time.perf_counter() - started:.1f} s)")
    print(f"  workers {trial.workers()}, complete {trial.is_complete()}")
    for mode in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
        print(f"  {mode.name:<8} saved mode steps {trial.steps(mode=mode)}")
    for collection in ("losses", "metrics", "weights", "biases", "gradients", "optimizer_variables", "default"):
        names = trial.tensor_names(collection=collection)
        print(f"  {collection:<20} {len(names):>3} tensors, e.g. {', '.join(names[:3])}")
    loss = trial.tensor("loss").values(mode=ModeKeys.TRAIN)
    print("  train loss by step  " + ", ".join(f"{step}: {float(value):.4f}" for step, value in loss.items()))
    grad = trial.tensor("gradients/hidden/kernel")
    last = grad.steps(mode=ModeKeys.TRAIN)[-1]
    print(f"  |gradients/hidden/kernel| mean at train step {last}: {float(np.abs(grad.value(last, mode=ModeKeys.TRAIN)).mean()):.6f}")
    print(f"  outputs/logits at predict step 0: shape {trial.tensor('outputs/logits').value(0, mode=ModeKeys.PREDICT).shape}")
    return [out_dir]


if __name__ == "__main__":
    import tempfile

    run(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="stepscope_keras_demo_"))
