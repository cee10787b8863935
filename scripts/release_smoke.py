"""Smoke test of the release wheels, run by `nox -s release-check` with the python of a fresh
virtualenv holding only the wheels, from a folder outside the checkout:

    python release_smoke.py CHECKOUT

It checks that nothing is imported from CHECKOUT, that stepscope-torch's compiled hot path
(which drives a hook) and stepscope's compiled trace parser and small-file publisher are
in their wheels, `stepscope
--version`, a tiny hooked torch job read back
(values compared with the model's own), `stepscope ui` serving its bundle over HTTP, and
`stepscope report` writing its HTML."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"release smoke test FAILED: {what}")
    print(f"ok  {what}", flush=True)


def installed_not_checkout(checkout: Path) -> None:
    import stepscope
    import stepscope_torch

    prefix = Path(sys.prefix).resolve()
    for module in (stepscope, stepscope_torch):
        where = Path(module.__file__ or "").resolve()
        check(prefix in where.parents and checkout not in where.parents, f"{module.__name__} imported from the virtualenv ({where})")
    for dist in ("stepscope", "stepscope-torch", "stepscope-tf"):
        direct_url = importlib.metadata.distribution(dist).read_text("direct_url.json") or ""
        check(".whl" in direct_url and "dir_info" not in direct_url, f"{dist} installed from its wheel, not from a folder")
        files = [str(f) for f in importlib.metadata.files(dist) or []]
        check(any(f.endswith("LICENSE") and ".dist-info/" in f for f in files), f"{dist}'s wheel carries its LICENSE")
    tf_files = [str(f) for f in importlib.metadata.files("stepscope-tf") or []]
    check("stepscope_tf/__init__.py" in tf_files and "stepscope_tf/py.typed" in tf_files, "stepscope-tf's wheel holds its package")


def compiled_path() -> None:
    from stepscope.traces import native
    from stepscope_torch import fastpath

    module = fastpath.compiled()
    check(module is not None and Path(module.__file__).suffix in (".so", ".pyd"), f"compiled hot path in the wheel ({getattr(module, '__file__', None)})")
    parser = native.compiled()
    check(parser is not None and Path(parser.__file__).suffix in (".so", ".pyd"), f"compiled trace parser in stepscope's wheel ({getattr(parser, '__file__', None)})")
    from stepscope.store import local

    if os.name == "posix":  # (Windows publishes from Python)
        publisher = sys.modules.get("stepscope.store._publish")
        check(local._publish_small is not None and publisher is not None and Path(publisher.__file__).suffix == ".so",
              f"compiled small-file publisher in stepscope's wheel ({getattr(publisher, '__file__', None)})")
    from stepscope.capture import step_framing

    encoders = step_framing._encode
    check(encoders is not None and Path(encoders.__file__).suffix in (".so", ".pyd"),
          f"compiled encoders (held steps, step timeline) in stepscope's wheel ({getattr(encoders, '__file__', None)})")
    from stepscope.compiled import load_extension

    batches = load_extension("stepscope.capture", "_batches")
    check(batches is not None and Path(batches.__file__).suffix in (".so", ".pyd"),
          f"compiled routine batches (callbacks' loss-only steps) in stepscope's wheel ({getattr(batches, '__file__', None)})")


def version() -> None:
    stepscope = Path(sys.executable).parent / "stepscope"
    out = subprocess.run([str(stepscope), "--version"], capture_output=True, text=True, check=True).stdout
    expected = importlib.metadata.version("stepscope")
    check(expected in out, f"`stepscope --version` says {out.strip()!r} (installed {expected})")


def hooked_job(out_dir: Path) -> None:
    import numpy as np
    import torch

    import stepscope
    from stepscope.config import SaveConfig
    from stepscope_torch import Hook

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    expected: dict[int, np.ndarray] = {}
    with Hook(str(out_dir), save_config=SaveConfig(save_interval=1), include_collections=["weights", "losses"]) as hook:
        check(hook._fast is not None, "the hook runs on the compiled path")
        hook.register_module(model)
        hook.register_optimizer(optimizer)
        for step in range(5):
            expected[step] = model.weight.detach().numpy().copy()  # what the hook saves at this step's forward
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            hook.save_loss(loss)
            loss.backward()
            optimizer.step()
    trial = stepscope.create_trial(str(out_dir))
    check(trial.steps() == [0, 1, 2, 3, 4], f"the job's steps read back: {trial.steps()}")
    name = next(n for n in trial.tensor_names(collection="weights") if n.endswith("weight"))
    for step, value in expected.items():
        got = trial.tensor(name).value(step)
        if not np.allclose(got, value):
            check(False, f"{name} at step {step} read back as the model had it")
    check(True, f"{name} read back at every step as the model had it")


def ui_serves_bundle(store: Path, work: Path) -> None:
    import stepscope.ui

    stepscope_exe = Path(sys.executable).parent / "stepscope"
    proc = subprocess.Popen([str(stepscope_exe), "ui", str(store), "--port", "0", "--db", str(work / "users.db")],
                            stderr=subprocess.PIPE, text=True)
    try:
        url, deadline, seen = None, time.monotonic() + 60, []
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline() if proc.stderr else ""
            if not line:
                break
            seen.append(line)
            match = re.search(r"serving .* on (https?://[\d.]+:\d+)/", line)
            url = match.group(1) if match else None
        check(url is not None, f"`stepscope ui` started ({''.join(seen[-3:]).strip()})")
        with urllib.request.urlopen(f"{url}/static/app.js", timeout=30) as response:
            body = response.read()
            status = response.status
        installed = (Path(stepscope.ui.__file__).parent / "static" / "app.js").read_bytes()
        check(status == 200 and body == installed and len(body) > 10_000, f"GET /static/app.js: {status}, {len(body)} bytes, the installed bundle")
    finally:
        proc.terminate()
        proc.wait(10)


def report(job: Path) -> None:
    stepscope_exe = Path(sys.executable).parent / "stepscope"
    done = subprocess.run([str(stepscope_exe), "report", str(job)], capture_output=True, text=True)
    html = job / "stepscope-report.html"
    check(done.returncode == 0 and html.is_file(), f"`stepscope report` exit {done.returncode} {done.stderr.strip()[-300:]}")
    text = html.read_text()
    check(text.lstrip().lower().startswith("<!doctype html") and "</html>" in text and len(text) > 5_000, f"report HTML written ({len(text)} bytes)")


def main() -> int:
    checkout = Path(sys.argv[1]).resolve()
    os.environ.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory(prefix="stepscope-smoke-") as tmp:
        work = Path(tmp)
        installed_not_checkout(checkout)
        compiled_path()
        version()
        job = work / "store" / "job1"
        hooked_job(job)
        ui_serves_bundle(work / "store", work)
        report(job)
    print("release smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
