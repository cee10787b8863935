"""Files the command line writes are written whole or not at all, and never through or
over a link, device or FIFO (stepscope.outputs)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import pytest

from stepscope.cli import main
from stepscope.exceptions import OutputError
from stepscope.outputs import atomic_output

COMMANDS = {
    "report": lambda job, target: ["report", str(job), "-o", str(target), "--rules", "none", "--no-progress"],
    "hdf5": lambda job, target: ["export", str(job), "--hdf5", str(target), "--no-progress"],
}


@pytest.fixture
def job(tmp_path, write_job):
    write_job(str(tmp_path / "job"))
    return tmp_path / "job"


def _leftovers(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith((".tmp", ".partial")))


def test_atomic_output_publishes_only_what_completed(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"earlier")
    with pytest.raises(RuntimeError), atomic_output(target) as handle:
        handle.write(b"half")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"earlier" and _leftovers(tmp_path) == []
    with atomic_output(target) as handle:
        handle.write(b"new")
    assert target.read_bytes() == b"new" and _leftovers(tmp_path) == []


def test_a_full_disk_at_flush_leaves_the_earlier_file(tmp_path, monkeypatch):
    target = tmp_path / "out.bin"
    target.write_bytes(b"earlier")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("stepscope.outputs.os.fsync", full)
    with pytest.raises(OutputError, match="out.bin.*No space left"), atomic_output(target) as handle:
        handle.write(b"x" * 100_000)
    assert target.read_bytes() == b"earlier" and _leftovers(tmp_path) == []


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("kind", ["symlink", "fifo", "device", "folder"])
def test_a_target_that_is_not_a_regular_file_is_refused(command, kind, job, tmp_path, capsys):
    target = tmp_path / "target"
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    if kind == "symlink":
        target.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    else:
        target = "/dev/null"
    before = os.lstat(target)
    assert main(COMMANDS[command](job, target)) == 2
    err = capsys.readouterr().err
    assert str(target) in err and "Traceback" not in err
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
    assert victim.read_bytes() == b"keep" and _leftovers(tmp_path) == []


def test_a_dangling_link_target_is_refused_not_created(tmp_path):
    target = tmp_path / "t.json"
    target.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(OutputError, match="symbolic link"), atomic_output(target):
        pass
    assert not (tmp_path / "elsewhere.json").exists() and target.is_symlink()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_file_size_limit_hit_mid_write_keeps_the_earlier_file(command, job, tmp_path):
    # A real failure from the kernel (EFBIG past RLIMIT_FSIZE, as a full disk gives
    # ENOSPC), in a child process whose limit does not touch the test's.
    target = tmp_path / "out"
    target.write_bytes(b"earlier")
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        from stepscope.cli import main
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
        sys.exit(main({COMMANDS[command](job, target)!r}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert str(target) in done.stderr and "Traceback" not in done.stderr
    assert target.read_bytes() == b"earlier" and _leftovers(tmp_path) == []


@pytest.mark.parametrize("target", ["", "out/", "."])
def test_a_target_naming_a_folder_is_refused_with_its_name(target, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match="names a folder"), atomic_output(target):
        pass
    assert os.listdir(tmp_path) == []
