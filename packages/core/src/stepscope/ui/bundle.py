"""The web app's bundle (static/app.js, app.css, built by esbuild from packages/core/ui-src):
which files make it, the record written beside it, and whether it is there.

Standard library only: the build hook (packages/core/build_ui.py) loads this file by its
path, before stepscope or its dependencies are importable."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"
FILES = ("app.js", "app.css")
# {"sources_sha256": digest of ui-src when built, "files": {name: sha256}}; a content hash
# rather than mtimes, which a fresh clone or an unpacked sdist sets to arbitrary values.
RECORD = "bundle.json"
BUILD_COMMAND = "python scripts/build_ui.py"


def sources_digest(ui_src: Path) -> str:
    """sha256 over what the bundle is built from: package.json, package-lock.json and every
    file under src/, by relative path and content (node_modules and build outputs left out)."""
    files = [ui_src / "package.json", ui_src / "package-lock.json", *sorted(p for p in (ui_src / "src").rglob("*") if p.is_file())]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(ui_src).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def missing(static_dir: Path | None = None) -> list[str]:
    """The bundle's files absent from `static_dir` (default: this installation's)."""
    static_dir = STATIC_DIR if static_dir is None else static_dir
    return [name for name in FILES if not (static_dir / name).is_file()]


def read_record(static_dir: Path | None = None) -> dict | None:
    path = (STATIC_DIR if static_dir is None else static_dir) / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def missing_message(static_dir: Path | None = None) -> str | None:
    """None when the bundle is there; else what is missing and the command that builds it."""
    static_dir = STATIC_DIR if static_dir is None else static_dir
    absent = missing(static_dir)
    if not absent:
        return None
    return (
        f"the web app's bundle is not built: {', '.join(absent)} missing in {static_dir}. "
        f"In a checkout run `{BUILD_COMMAND}` (needs npm; Debian: apt-get install npm), "
        "or reinstall stepscope from a wheel (which carries the bundle)"
    )
