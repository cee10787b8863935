"""The six minutes after a benchmark removes its jobs. On ext4 without a journal (this VM's),
a file made near inodes freed in the last 60 s, or the last 360 s while their inode table
block is dirty, costs several times its usual CPU (`recently_deleted` in fs/ext4/ialloc.c):
a bench that writes files and starts right after another removed its jobs measures high.
Each bench that removes jobs marks the time in the temporary folder (whose file system it
is about; one mark for all of them), and a bench whose figures depend on file creation
waits until six minutes have passed since the last mark."""

from __future__ import annotations

import os
import tempfile
import time

QUIET_S = 360
MARK = os.path.join(tempfile.gettempdir(), "stepscope-bench-removed")


def wait_for_quiet(wait: bool = True) -> None:
    """Wait out what is left of QUIET_S since the last mark (`wait` False: only say that the
    figures may read high)."""
    try:
        with open(MARK) as f:
            removed_at = float(f.read())
    except (OSError, ValueError):
        return
    left = QUIET_S - (time.time() - removed_at)
    if left <= 0:
        return
    ago = QUIET_S - left
    if not wait:
        print(f"(a benchmark removed its jobs {ago:.0f} s ago: files made now cost more on ext4, and these figures may read high)", flush=True)
        return
    print(f"(a benchmark removed its jobs {ago:.0f} s ago: waiting {left:.0f} s, until files cost what they usually do)", flush=True)
    time.sleep(left)


def mark_removed() -> None:
    """This bench has just removed its jobs."""
    try:
        with open(MARK, "w") as f:
            f.write(repr(time.time()))
    except OSError:
        pass
