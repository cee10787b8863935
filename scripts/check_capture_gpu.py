"""Check the save path of CUDA tensors end to end on a machine with a GPU. Prints one line
per check; exits 1 when a check fails, 2 when there is no GPU (`--device cpu` runs the same
checks on the CPU path, to try the script anywhere).

    python scripts/check_capture_gpu.py                 # temporary folder on the default file system
    python scripts/check_capture_gpu.py --out /tmp/capturecheck

An MLP on the GPU trains with a Hook saving weights and gradients every 10 steps, large
files written around the page cache (STEPSCOPE_DIRECT_IO=1: the folder must be on ext4, XFS
or Btrfs). The script keeps its own copies (`.cpu()`) of each parameter at each save step's
start and of each gradient after its backward.

1. Every saved value the trial reads equals the script's copy, bit for bit.
2. The snapshots of CUDA tensors arrive in pinned host memory (page-aligned): each tensor of
   256 KiB or more starts on a 4096-byte offset of its event file, behind a padding record,
   so the direct write took it from the pinned memory (docs/format.md, "Padding records").
3. The hook's added time per step over the plain loop, interleaved blocks (printed, not
   judged: the issue's goals are measured on CPU by bench/bench_vs_smdebug.py)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="the job's folder (default: a temporary one)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    os.environ["STEPSCOPE_DIRECT_IO"] = "1"
    import torch
    from torch import nn

    from stepscope.config import ProfilerConfig, SaveConfig
    from stepscope.store.direct_io import ALIGN, PLACE_FROM, direct_io_allowed
    from stepscope.trial import create_trial
    from stepscope_torch import Hook

    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIP no CUDA device")
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="stepscope-capture-"))
    out.mkdir(parents=True, exist_ok=True)
    failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)

    device = torch.device(args.device)

    def model() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
        return m, torch.optim.SGD(m.parameters(), lr=0.01)

    x, y = torch.randn(64, 256, device=device), torch.randint(0, 10, (64,), device=device)
    loss_fn = nn.CrossEntropyLoss()
    net, optimizer = model()
    hook = Hook(str(out), save_config=SaveConfig(save_interval=10), include_collections=["weights", "gradients"], profiler_config=ProfilerConfig.disabled())
    hook.register_module(net)
    hook.register_loss(loss_fn)
    expected: dict[tuple[str, int], np.ndarray] = {}
    for step in range(args.steps):
        due = step % 10 == 0
        if due:
            expected.update(((name, step), p.detach().cpu().numpy().copy()) for name, p in net.named_parameters() if name.endswith("weight"))
        optimizer.zero_grad()
        loss_fn(net(x), y).backward()
        if due:
            expected.update(((f"gradient/{name}", step), p.grad.cpu().numpy().copy()) for name, p in net.named_parameters())
        optimizer.step()
    hook.close()

    trial = create_trial(str(out))
    mismatched = [key for key, value in expected.items() if not np.array_equal(trial.tensor(key[0]).value(key[1]), value)]
    check(not mismatched, f"1. {len(expected)} saved values equal the script's copies{f'; differ: {mismatched[:3]}' if mismatched else ''}")

    if not direct_io_allowed(str(out)):
        print(f"SKIP 2. {out} is not on ext4, XFS or Btrfs: no direct writes, no padding")
    else:
        misplaced, placed = [], 0
        for index_file in sorted(out.glob("index/*/*.json")):
            index = json.loads(index_file.read_text())
            data = (out / index["meta"]["event_file_name"]).read_bytes()
            step = int(index_file.name.split("_")[0])
            for entry in index["tensor_payload"]:
                value = expected.get((entry["tensorname"], step))
                if value is None or value.nbytes < PLACE_FROM:
                    continue
                at = data.find(value.tobytes(), entry["start_idx"], entry["start_idx"] + entry["length"])
                placed += at % ALIGN == 0
                if at % ALIGN:
                    misplaced.append((entry["tensorname"], step, at))
        check(placed > 0 and not misplaced, f"2. {placed} large tensors start on a {ALIGN}-byte file offset{f'; not: {misplaced[:3]}' if misplaced else ''}")

    plain_net, plain_opt = model()
    hooked_net, hooked_opt = model()
    timing_hook = Hook(str(out) + "-timing", save_config=SaveConfig(save_interval=10), include_collections=["weights", "gradients"],
                       profiler_config=ProfilerConfig.disabled())  # fmt: skip
    timing_hook.register_module(hooked_net)
    timing_hook.register_loss(loss_fn)

    def block(net: nn.Module, opt: torch.optim.Optimizer, steps: int = 50) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            loss_fn(net(x), y).backward()
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if net is hooked_net:
            timing_hook._runtime.writer.flush()
        return (time.perf_counter() - start) / steps

    times: dict[str, list[float]] = {"plain": [], "hooked": []}
    for i in range(21):
        for name in ("plain", "hooked") if i % 2 else ("hooked", "plain"):
            times[name].append(block(plain_net, plain_opt) if name == "plain" else block(hooked_net, hooked_opt))
    timing_hook.close()
    plain, hooked = statistics.median(times["plain"][1:]), statistics.median(times["hooked"][1:])
    print(f"info 3. plain {plain * 1e3:.3f} ms a step, hooked {hooked * 1e3:.3f} ({hooked / plain:.3f}x), weights and gradients every 10 steps")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
