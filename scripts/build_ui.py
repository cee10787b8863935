"""Build the web app's scripts and styles: `npm ci` (pinned by package-lock.json, from the
npm registry) then `npm run build` (esbuild bundles packages/core/ui-src into
stepscope/ui/static). The bundle is not committed; nox's install step runs this.

    python scripts/build_ui.py            # install if needed, build
    python scripts/build_ui.py --check    # exit 1 when the bundle is missing or older than the sources
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "packages" / "core" / "ui-src"
STATIC = ROOT / "packages" / "core" / "src" / "stepscope" / "ui" / "static"
OUTPUTS = (STATIC / "app.js", STATIC / "app.css")


def up_to_date() -> bool:
    if not all(p.is_file() for p in OUTPUTS):
        return False
    newest_source = max(p.stat().st_mtime for p in [*SOURCES.glob("src/*"), SOURCES / "package-lock.json"])
    return min(p.stat().st_mtime for p in OUTPUTS) >= newest_source


def build() -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("build_ui: npm is not installed (Debian: apt-get install npm); the app needs its bundle")
    installed = SOURCES / "node_modules" / ".package-lock.json"
    if not installed.is_file() or installed.stat().st_mtime < (SOURCES / "package-lock.json").stat().st_mtime:
        subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=SOURCES, check=True)
    subprocess.run([npm, "run", "--silent", "build"], cwd=SOURCES, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the bundle is built and current")
    args = parser.parse_args(argv)
    if args.check:
        return 0 if up_to_date() else 1
    build()
    print(f"build_ui: {', '.join(f'{p.name} {p.stat().st_size // 1024} KiB' for p in OUTPUTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
