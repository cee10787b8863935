"""The file-side probe (stepscope.testing.probe_files), in full: symbolic links at every
level of a real job, hostile files of every kind for every command line reader, special
files as outputs, and a full disk (a 64 KiB tmpfs when this process may mount one, else a
file-size limit). Prints cases tried / clean / escapes / losses / tracebacks / hangs and
each case that was not clean. Goal: 0 escapes, 0 losses, 0 tracebacks, 0 hangs.

    python bench/bench_probe_files.py [--only SUBSTRING] [--readers check,report] [--jobs 2]
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stepscope.testing.probe_files import READERS, all_cases, make_base_job, run_case

FULL_DISK_COMMANDS = {
    "report": lambda job, out: ["report", str(job), "-o", str(out), "--rules", "none", "--no-progress"],
    "timeline": lambda job, out: ["timeline", str(job), "-o", str(out)],
    "export-hdf5": lambda job, out: ["export", str(job), "--hdf5", str(out), "--no-progress"],
}


def full_disk(base: Path, scratch: Path) -> list[tuple[str, str, str]]:
    """Each output command onto a full disk: the earlier file must stay as it was, no
    temporary left, exit 2 without a traceback."""
    mount = scratch / "tiny"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode == 0
    results = []
    try:
        for name, command in FULL_DISK_COMMANDS.items():
            target = mount / f"{name}.out"
            target.write_bytes(b"earlier")
            limit = "" if mounted else "import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048)); "
            code = f"{limit}import sys; from stepscope.cli import main; sys.exit(main({command(base, target)!r}))"
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            leftovers = [n for n in os.listdir(mount) if n.endswith((".tmp", ".partial"))]
            if "Traceback" in done.stderr:
                verdict = "traceback"
            elif target.read_bytes() != b"earlier" or leftovers or done.returncode != 2:
                verdict = "loss"
            else:
                verdict = "clean"
            results.append((f"full-disk ({'tmpfs' if mounted else 'RLIMIT_FSIZE'})", name, verdict, done.stderr.strip()[-200:]))
            for n in os.listdir(mount):
                os.unlink(mount / n)
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)], check=False)
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="cases whose name contains this")
    parser.add_argument("--mechanism", default="", help="symlink, hostile-file or output")
    parser.add_argument("--readers", default=",".join(READERS))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    readers = args.readers.split(",")
    with tempfile.TemporaryDirectory(prefix="stepscope-probe-") as tmp:
        scratch = Path(tmp)
        started = time.monotonic()
        base = make_base_job(scratch / "base" / "job")
        cases = [c for c in all_cases(base) if args.only in c.name and args.mechanism in c.mechanism]
        print(f"base job made in {time.monotonic() - started:.0f} s; {len(cases)} cases x {len(readers)} readers", flush=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            outcomes = [o for batch in pool.map(lambda c: run_case(c, base, scratch, readers), cases) for o in batch]
        rows = [(o.case, o.reader, o.verdict, (o.detail or " ".join(o.touched)).replace("\n", " ")[-200:]) for o in outcomes]
        if not args.only and args.mechanism in ("", "output"):  # the full disk is an output case
            rows += full_disk(base, scratch)
    counts = collections.Counter(r[2] for r in rows)
    for case, reader, verdict, detail in rows:
        if verdict != "clean":
            print(f"{verdict:9s} {case:50s} {reader:12s} {detail}")
    slowest = max(outcomes, key=lambda o: o.seconds) if outcomes else None
    print(f"\ncases tried {len(rows)} | clean {counts['clean']} | escapes {counts['escape']} | losses {counts['loss']} | tracebacks {counts['traceback']} | hangs {counts['hang']}")
    if slowest is not None:
        print(f"slowest: {slowest.case} / {slowest.reader} {slowest.seconds:.1f} s; total {time.monotonic() - started:.0f} s")
    return 0 if counts["clean"] == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
