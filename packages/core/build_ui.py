"""Build the web app's bundle (src/stepscope/ui/static/app.js, app.css) from ui-src with the
pinned npm packages (package-lock.json: esbuild, uPlot), and record the sources' digest
beside it (static/bundle.json) so that a later build knows whether it is current.

Called by every build of this package (setup.py: wheels, sdists, editable installs) and by
`python scripts/build_ui.py` from the repository root. Standard library only."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
UI_SRC = HERE / "ui-src"
STATIC = HERE / "src" / "stepscope" / "ui" / "static"
SKIP_ENV = "STEPSCOPE_SKIP_UI_BUILD"


def _bundle_module():
    """stepscope/ui/bundle.py, loaded by path: stepscope itself is not importable while it builds."""
    spec = importlib.util.spec_from_file_location("_stepscope_ui_bundle", HERE / "src" / "stepscope" / "ui" / "bundle.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bundle = _bundle_module()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def state() -> str:
    """'current' (built from these sources, files intact), 'prebuilt' (files there, no
    sources to compare with), 'missing' or 'stale' (with the reason after a colon)."""
    absent = bundle.missing(STATIC)
    if absent:
        return f"missing: {', '.join(absent)}"
    if not (UI_SRC / "src").is_dir():
        return "prebuilt"
    record = bundle.read_record(STATIC)
    if record is None:
        return f"stale: no {bundle.RECORD} beside the bundle"
    if record.get("sources_sha256") != bundle.sources_digest(UI_SRC):
        return "stale: ui-src changed since the bundle was built"
    files = record.get("files") or {}
    changed = [name for name in bundle.FILES if files.get(name) != _sha256(STATIC / name)]
    if changed:
        return f"stale: {', '.join(changed)} changed since it was built"
    return "current"


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(
            "stepscope: building the web app's bundle (ui-src -> stepscope/ui/static/app.js) needs npm, which is not "
            "installed. Install it (Debian/Ubuntu: apt-get install npm; elsewhere Node.js from nodejs.org) and retry, "
            f"or set {SKIP_ENV}=1 to install without the app (`stepscope ui` then refuses to start)."
        )
    return npm


def build() -> None:
    """npm ci (only when package-lock.json changed since the last one), then esbuild, then the record."""
    npm = _npm()
    lock_digest = _sha256(UI_SRC / "package-lock.json")
    stamp = UI_SRC / "node_modules" / ".stepscope-lock.sha256"
    if not stamp.is_file() or stamp.read_text().strip() != lock_digest:
        _run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], "installs esbuild and uPlot from the npm registry, which must be reachable")
        stamp.write_text(lock_digest + "\n")
    (STATIC / bundle.RECORD).unlink(missing_ok=True)  # no record of a half-built bundle
    _run([npm, "run", "--silent", "build"], "bundles ui-src with esbuild")
    # The record is written only once the bundle exists (a fresh clone has none before this).
    record = {"sources_sha256": bundle.sources_digest(UI_SRC), "files": {name: _sha256(STATIC / name) for name in bundle.FILES}}
    (STATIC / bundle.RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def _run(command: list[str], what: str) -> None:
    try:
        subprocess.run(command, cwd=UI_SRC, check=True)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"stepscope: building the web app's bundle failed: `{' '.join(command[1:])}` in {UI_SRC} "
                         f"(it {what}) exited {exc.returncode}; its output is above") from None


def ensure() -> str:
    """Build unless the bundle is current (or prebuilt, in a tree without ui-src); returns
    what was done. STEPSCOPE_SKIP_UI_BUILD=1 leaves a missing or stale bundle as it is."""
    now = state()
    if now in ("current", "prebuilt"):
        return now
    if os.environ.get(SKIP_ENV, "") not in ("", "0"):
        return f"skipped ({SKIP_ENV}): {now}"
    build()
    return f"built ({now})"
