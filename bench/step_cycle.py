"""Where in the hook's cycle of steps the default configuration's cost lands: each step of a
hooked MLP loop timed on its own (wall and the training thread's CPU), then, by the step's
position in the held-steps cycle (HOLD_STEPS, 100), how far that position's steps are
above the median step on average. A cost spread evenly over the steps shows nowhere; one
that comes with the cycle (the held batch handed to the writer every 100 steps, what the
writer's threads then do beside the training thread) shows at the positions after it. A
plain loop in the same process is the reference (its positions show the machine's own
noise); a flush of the step timeline (every 10 s) lands on whichever position it meets,
and shows in the slowest step.

    python bench/step_cycle.py [--steps 6000] [--threads 1]

On the development VM (2026-12-06, two runs each): with the held batch framed in Python,
the steps one to three after each hand-over were 0.3-1.9 ms slower than the median, most
of it waiting for the GIL, and the slowest step (a timeline flush) 40-65 ms. With both in
C (stepscope.capture._encode) the worst position is 0.37-0.49 ms above the median, mostly
the training thread's own CPU while the publisher creates the batch's index files on the
other core, and the slowest step 8-10 ms. Read docs/pytorch.md#cost for the rest."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np
import torch
from bench_torch_hook import _steady_malloc, mlp  # (this folder is the script's)

from stepscope.capture.held_steps import HOLD_STEPS
from stepscope_torch import Hook


def timed_steps(steps: int, hook: Hook | None) -> tuple[np.ndarray, np.ndarray]:
    """(wall, CPU of this thread) of each of `steps` steps of a fresh MLP loop, after 200."""
    torch.manual_seed(0)
    model, shape = mlp()
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if hook is not None:
        hook.register_module(model)
        hook.register_loss(loss_fn)
    x, y = torch.randn(*shape), torch.randint(0, 10, (shape[0],))

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()

    for _ in range(200):
        step()
    wall, cpu = np.empty(steps), np.empty(steps)
    for i in range(steps):
        start, start_cpu = time.perf_counter(), time.thread_time()
        step()
        wall[i], cpu[i] = time.perf_counter() - start, time.thread_time() - start_cpu
    return wall, cpu


def by_position(times: np.ndarray, cycle: int) -> np.ndarray:
    """Mean excess over the median step, per position in the cycle."""
    excess = times - np.median(times)
    return np.array([excess[k::cycle].mean() for k in range(cycle)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6000, help="timed steps per loop (a multiple of 100 keeps every position equally counted)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _steady_malloc()
    print(f"MLP 784-512-256-10, {args.threads} thread(s), {args.steps} timed steps per loop; positions in the {HOLD_STEPS}-step cycle, "
          "counted from the hook's step 0 (200 warm-up steps first)")
    plain_wall, _ = timed_steps(args.steps, None)
    with tempfile.TemporaryDirectory() as out:
        hook = Hook(out)
        hooked_wall, hooked_cpu = timed_steps(args.steps, hook)
        hook.close()
    for name, wall in (("plain", plain_wall), ("hooked", hooked_wall)):
        q = np.percentile(wall, [50, 99]) * 1e3
        print(f"{name:7} median {q[0]:.3f} ms, p99 {q[1]:.3f} ms, max {wall.max() * 1e3:.3f} ms")
    # (The hooked loop's step i is the hook's step i + 200: its cycle position is (i + 200) % cycle.)
    shift = 200 % HOLD_STEPS
    wall_excess = np.roll(by_position(hooked_wall, HOLD_STEPS), shift)
    cpu_excess = np.roll(by_position(hooked_cpu, HOLD_STEPS), shift)
    plain_excess = np.roll(by_position(plain_wall, HOLD_STEPS), shift)
    top = np.argsort(wall_excess)[::-1][:5]
    print("slowest positions of the hooked loop (mean excess over its median step, ms): wall / training thread CPU / plain loop's wall")
    for position in top:
        print(f"  step % {HOLD_STEPS} == {position:2d}: {wall_excess[position] * 1e3:6.2f} / {cpu_excess[position] * 1e3:6.2f} / {plain_excess[position] * 1e3:6.2f}")
    # What the slow positions add, beyond the machine's own spread: the mean step's excess
    # over the median step, hooked against plain, per cycle.
    added = (hooked_wall.mean() - np.median(hooked_wall)) - (plain_wall.mean() - np.median(plain_wall))
    print(f"the hooked loop's mean step is {added * 1e3 * HOLD_STEPS:.2f} ms per {HOLD_STEPS} steps further above its median than the plain loop's "
          f"({added / np.median(hooked_wall) * 100:.1f} % of the median step)")

if __name__ == "__main__":
    sys.exit(main())
