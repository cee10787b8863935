"""`stepscope memory snapshot JOB`: ask a running job's hooks for a CUDA allocator snapshot
(each writes one at its next TRAIN step end and answers); `stepscope memory summary FILE`:
summarise a snapshot file of any size (streamed, bounded memory); `stepscope memory
blackbox JOB`: what each worker's black box recorded."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    from ..cli_common import add_command

    parser = add_command(sub, "memory", lambda args: _usage(parser), summary="CUDA allocator snapshots: ask a running job for one, summarise one")
    commands = parser.add_subparsers(dest="memory_command", metavar="SUBCOMMAND")
    ask = add_command(
        commands,
        "snapshot",
        run_snapshot,
        summary="ask a running job's hooks for an allocator snapshot",
        description=(
            "Leave a request in the job (stepscope-control/request.json) that every hook of the running job honours at its "
            "next TRAIN step end: it writes torch.cuda.memory._snapshot() under profiler-output/framework/pytorch/memory/ "
            "and answers under stepscope-control/responses/. Waits for the answers and prints them."
        ),
    )
    ask.add_argument("path", help="the running job's folder or s3:// URL")
    ask.add_argument("--wait", type=float, default=60.0, metavar="S", help="seconds to wait for the answers (default 60; 0: do not wait)")
    ask.add_argument("--workers", type=int, default=1, metavar="N", help="stop waiting once N workers answered (default 1)")
    summary = add_command(
        commands,
        "summary",
        run_summary,
        summary="summarise an allocator snapshot file of any size (streamed)",
        description="Per device reserved, allocated, fragmentation, largest free block, OOMs; live bytes by user frame; the history's peak.",
    )
    summary.add_argument("file", help="a snapshot (.pickle, .pickle.gz), local or s3://")
    summary.add_argument("--top", type=int, default=10, help="frames to list (default 10)")
    boxes = add_command(commands, "blackbox", run_blackbox, summary="what each worker's black box recorded (failures, NaNs, requests)",
                        description="One block per black box under stepscope-blackbox/: why, where, the exception, memory, attachments.")  # fmt: skip
    boxes.add_argument("path", help="the job's folder or s3:// URL")


def _usage(parser: argparse.ArgumentParser) -> int:
    from ..cli_common import EXIT_ERROR

    parser.print_help(sys.stderr)
    return EXIT_ERROR


def run_snapshot(args: argparse.Namespace) -> int:
    from ..capture.control import MEMORY_SNAPSHOT, read_responses, send_request
    from ..cli_common import EXIT_ERROR, EXIT_OK, UsageError
    from ..layout import REQUEST_KEY
    from ..store import open_store

    if args.wait < 0 or args.workers < 1:
        raise UsageError("--wait must be >= 0 and --workers >= 1")
    store = open_store(args.path)
    if not store.root_exists():
        raise UsageError(f"{args.path}: no such job")
    request_id = send_request(store, MEMORY_SNAPSHOT, "stepscope memory snapshot")
    print(f"request {request_id} left in {store.describe(REQUEST_KEY)}")
    if args.wait == 0:
        return EXIT_OK
    deadline = time.monotonic() + args.wait
    answers: list[dict] = []
    while time.monotonic() < deadline:
        answers = read_responses(store, request_id)
        if len(answers) >= args.workers and all(a.get("error") or a.get("written") for a in answers):
            break
        time.sleep(0.5)
    for answer in answers:
        where = ", ".join(answer.get("written") or []) or f"nothing written: {answer.get('error')}"
        print(f"{answer.get('worker')} (rank {answer.get('rank')}, step {answer.get('step')}): {where}")
    if not answers:
        print(f"no worker answered within {args.wait:g} s: is the job running and training? "
              "(requests are honoured at the end of a TRAIN step)", file=sys.stderr)  # fmt: skip
        return EXIT_ERROR
    return EXIT_OK if any(a.get("written") for a in answers) else EXIT_ERROR


def run_summary(args: argparse.Namespace) -> int:
    from ..cli_common import EXIT_OK
    from .snapshot_stream import summarize

    result = summarize(args.file)
    print(result.summary.to_string(index=False))
    for device in result.summary["device"].tolist():
        print(f"\ndevice {device}: live at the snapshot by frame")
        print(result.by_frame(device).head(args.top).to_string(index=False))
        at, frames = result.peak(device)
        print(f"device {device}: history peak {at['allocated']:,} bytes at entry {at['index']}")
        print(frames.head(args.top).to_string(index=False))
    print(f"\n{result.stats()}")
    return EXIT_OK


def black_boxes(store: Any) -> list[tuple[str, dict[str, Any]]]:
    """(key, record) of every black box of the job, in key order; an unreadable one is a
    record holding only `unreadable` (why)."""
    from ..exceptions import StepscopeError
    from ..job_files import read_json
    from ..layout import BLACKBOX_DIR

    out = []
    for key in sorted(k for k in store.list(f"{BLACKBOX_DIR}/") if k.endswith("/record.json")):
        try:
            record = read_json(store, key)
        except (StepscopeError, OSError, ValueError) as exc:
            record = {"unreadable": str(exc)}
        out.append((key, record if isinstance(record, dict) else {"unreadable": "not a JSON object"}))
    return out


def run_blackbox(args: argparse.Namespace) -> int:
    from ..cli_common import EXIT_ERROR, EXIT_OK, UsageError
    from ..store import open_store

    store = open_store(args.path)
    if not store.root_exists():
        raise UsageError(f"{args.path}: no such job")
    found = black_boxes(store)
    if not found:
        print(f"{args.path}: no black box (no worker failed, saw a NaN or was asked for one)", file=sys.stderr)
        return EXIT_ERROR
    for key, record in found:
        print(key)
        if "unreadable" in record:
            print(f"  unreadable: {record['unreadable']}")
            continue
        print(f"  {record.get('reason')} on {record.get('worker')} (rank {record.get('rank')}) at {record.get('mode')} step {record.get('step')}")
        if record.get("exception"):
            print(f"  {record['exception']}: {str(record.get('message', '')).splitlines()[0] if record.get('message') else ''}")
        for name, counts in ((record.get("non_finite") or {}).get("tensors") or {}).items():
            print(f"  non-finite {name}: {counts}")
        host = record.get("host_memory") or {}
        if host:
            print(f"  host RSS {host.get('rss_bytes', 0) / 2**20:,.0f} MiB (peak {host.get('peak_rss_bytes', 0) / 2**20:,.0f} MiB)")
        for device in record.get("devices") or []:
            print(f"  {device.get('device')}: allocated {device.get('allocated_bytes', 0) / 2**20:,.0f} MiB, reserved "
                  f"{device.get('reserved_bytes', 0) / 2**20:,.0f} MiB, peak {device.get('peak_allocated_bytes', 0) / 2**20:,.0f} MiB, "
                  f"OOMs {device.get('num_ooms', 0)}")  # fmt: skip
        if record.get("attachments"):
            print(f"  attachments: {', '.join(record['attachments'])}")
        for name, why in (record.get("left_out") or {}).items():
            print(f"  left out {name}: {why}")
    return EXIT_OK
