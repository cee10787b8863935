"""CPU per small file (a held batch's index file: create a temporary, write, close, rename)
when the local store publishes a run of them, on the compiled path (`stepscope.store._publish`,
the GIL released once per run, its folder walked in the same call: `publish_files`; each file
written unnamed and linked in where the file system has O_TMPFILE) and on the Python path, in
the same folder tree, side by side.
The cost is mostly the kernel's (the file system's); it moves a lot on a shared VM.

    python bench/publish_files.py [--files 100] [--rounds 5] [--dir DIR]"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from stepscope.store import LocalStore, local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the store's folder goes (default: the temporary folder)")
    args = parser.parse_args()
    compiled = (local._publish_small, local._publish_files)
    paths = {"compiled": compiled, "python": (None, None)} if compiled[0] is not None else {"python": (None, None)}
    body = b'{"meta": {"mode": "TRAIN", "mode_step": 1}, "tensor_payload": [], "shape_payload": []}'
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        store = LocalStore(root)
        for r in range(args.rounds):
            for name, publish in paths.items():
                local._publish_small, local._publish_files = publish
                items = [(f"index/{name}{r:03d}/{i:012d}_worker_0.json", body) for i in range(args.files)]
                started = time.thread_time()
                store.write_many(items)
                cpu[name].append((time.thread_time() - started) / args.files)
    local._publish_small, local._publish_files = compiled
    print(f"{args.files} small files per run, {args.rounds} runs per path; CPU of the publishing thread per file (median):")
    for name, values in cpu.items():
        print(f"  {name:8} {statistics.median(values) * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
