"""Sessions: tests (everything CI runs), lint (ruff + mypy), demo (the README's main job), bench."""

from __future__ import annotations

import os
import shutil

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True
PYTHON = os.environ.get("STEPSCOPE_NOX_PYTHON", "3.11")
CONSTRAINTS = ("-c", "constraints/ci.txt")
PACKAGES = (
    "-e", "packages/core[test,all]",
    "-e", "packages/torch_plugin[lightning,hf]",
    "-e", "packages/tf_plugin[tf-cpu]",
)
QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONDONTWRITEBYTECODE": ""}


def _install(session: nox.Session, *extra: str) -> None:
    session.install(*CONSTRAINTS, *PACKAGES, *extra)


def _build_ui(session: nox.Session) -> None:
    """The web app's bundle (npm packages pinned by packages/core/ui-src/package-lock.json)."""
    if not shutil.which("npm") and os.geteuid() == 0:
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "npm", external=True, env={"DEBIAN_FRONTEND": "noninteractive"})
    session.run("python", "scripts/build_ui.py")


def _ensure_chromium(session: nox.Session) -> None:
    """The browser tests (report, app) drive Debian's Chromium; bring it on a fresh machine."""
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return
    if os.geteuid() != 0:
        session.warn("chromium/chromedriver missing and not root: browser tests will be skipped")
        return
    session.run("apt-get", "update", "-qq", external=True)
    session.run("apt-get", "install", "-y", "-qq", "chromium", "chromium-driver", external=True,
                env={"DEBIAN_FRONTEND": "noninteractive"})


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    _install(session)
    _build_ui(session)
    _ensure_chromium(session)
    args = session.posargs or ["packages/core/tests", "packages/torch_plugin/tests", "packages/tf_plugin/tests", "tests"]
    # The torch plugin's compiled hot path is built by the install above (a C compiler is
    # there): a test fails if it fell back to the Python path silently.
    session.run("pytest", "-q", "-p", "no:cacheprovider", *args, env={**QUIET_TF, "STEPSCOPE_EXPECT_COMPILED": "1"})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff, then mypy over the three packages' sources (settings in pyproject.toml; the
    frameworks are installed so that the plugins are checked against their real types)."""
    _install(session, "ruff==0.17.6", "mypy")
    session.run("ruff", "check", "packages", "tests", "bench", "demo", "scripts", "noxfile.py", "conftest.py")
    session.run(
        "mypy", "packages/core/src/stepscope", "packages/torch_plugin/src/stepscope_torch", "packages/tf_plugin/src/stepscope_tf",
        env=QUIET_TF,
    )


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    _install(session)
    session.run("python", "demo/run_demo.py", *session.posargs, env=QUIET_TF)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    _install(session)
    for script in sorted(os.listdir("bench")):
        if script.startswith("bench_") and script.endswith(".py"):
            session.run("python", f"bench/{script}", *session.posargs, env=QUIET_TF)
