"""The main job of the README: train small models on the CPU with stepscope's hooks
(PyTorch plain loop + Lightning, Keras), plant one problem on purpose, then run the rules
over every job and print what was saved, what the rules found and where the time went.

    python demo/run_demo.py [--out demo-output] [--skip-keras] [--skip-torch]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def exploding_job(out_dir: str) -> str:
    """A plain loop with a learning rate far too large: weights and loss blow up, and the
    ExplodingTensor rule's StopTraining action would end such a job (see docs/rules.md)."""
    import torch
    from torch import nn

    from stepscope.config import SaveConfig
    from stepscope_torch import Hook

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    x, y = torch.randn(256, 8), torch.randn(256, 1)
    with Hook(out_dir, save_config=SaveConfig(save_interval=2), include_collections=["weights", "gradients"]) as hook:
        hook.register_module(model)
        loss_fn = nn.MSELoss()
        hook.register_loss(loss_fn)
        hook.register_optimizer(optimizer)
        for step in range(40):
            batch = slice((step * 32) % 256, (step * 32) % 256 + 32)
            optimizer.zero_grad()
            loss_fn(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return out_dir


def summarize_profile(out_dir: str) -> None:
    """Where the time went (step timeline) and how busy the machine was (system metrics)."""
    import stepscope

    profiler = stepscope.create_trial(out_dir).profiler
    timeline = profiler.step_timeline()
    steps = timeline[timeline["phase"] == "step"]
    if len(steps):
        print(f"  timeline: {len(steps)} steps, median {steps['duration_ms'].median():.2f} ms, slowest {steps['duration_ms'].max():.2f} ms")
    phases = timeline[~timeline["phase"].isin(["step", "eval_step", "predict_step"])]
    if len(phases):
        share = phases.groupby("phase", observed=True)["duration_ms"].sum().sort_values(ascending=False)
        print("  time in phases: " + ", ".join(f"{phase} {100 * ms / share.sum():.0f}%" for phase, ms in share.items()))
    metrics = profiler.system_metrics()
    cpu = metrics[(metrics["dimension"] == "CPUUtilization") & (metrics["name"] == "total")]
    if len(cpu):
        print(f"  system: {cpu['timestamp'].nunique()} samples; CPU mean {cpu['value'].mean():.0f} %, p95 {cpu['value'].quantile(0.95):.0f} %")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="demo-output", help="folder for the jobs (emptied first)")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--skip-keras", action="store_true")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    jobs: list[str] = []
    if not args.skip_torch:
        import torch_demo

        print("== PyTorch: plain loop + Hook, Lightning + StepscopeCallback")
        jobs += torch_demo.run(str(out))
        print("== PyTorch: a job with a learning rate far too large")
        jobs.append(exploding_job(str(out / "exploding_job")))
    if not args.skip_keras:
        import keras_demo

        print("== Keras: fit / evaluate / predict + StepscopeCallback")
        jobs += keras_demo.run(str(out))

    from stepscope.cli import main as stepscope_cli

    for job in jobs:
        print(f"\n== stepscope check {os.path.relpath(job)}")
        stepscope_cli(["check", job, "--quiet"])
        summarize_profile(job)
        stepscope_cli(["report", job, "--no-progress"])  # one HTML file: open it in a browser
    print(f"\n== done in {time.perf_counter() - started:.1f} s; each job's rule reports are in <job>/rule-output/, its report in <job>/stepscope-report.html")
    return _self_check(jobs)


def _self_check(jobs: list[str]) -> int:
    """The planted problem must be found by the rule that names it, and the healthy jobs
    must get no finding at all: a debugger that cries wolf on healthy runs gets switched off."""
    import json

    problems = []
    for job in jobs:
        summary = json.loads((Path(job) / "rule-output" / "summary.json").read_text())
        fired = {r["rule"] for r in summary["rules"] if r.get("fired")}
        print(f"  {os.path.relpath(job)}: {', '.join(sorted(fired)) or 'no rule fired'}")
        if not (Path(job) / "stepscope-report.html").is_file():
            problems.append(f"{job}: no stepscope-report.html")
        planted = job.endswith("exploding_job")
        if planted and "ExplodingTensor" not in fired:
            problems.append(f"{job}: ExplodingTensor did not fire on the planted job")
        if not planted and fired:
            problems.append(f"{job}: a healthy job got findings: {sorted(fired)}")
    for problem in problems:
        print(f"demo self-check failed: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
