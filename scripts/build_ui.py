"""Build the web app's bundle (packages/core/ui-src -> stepscope/ui/static/app.js, app.css) with
npm and esbuild, pinned by package-lock.json. Every build of the `stepscope` package does
this too (packages/core/setup.py), editable installs included; run it by hand after
editing ui-src. The logic lives in packages/core/build_ui.py, which an sdist carries.

    python scripts/build_ui.py            # build unless current (a content hash of ui-src, recorded in static/bundle.json)
    python scripts/build_ui.py --force    # build anyway
    python scripts/build_ui.py --check    # exit 1 when the bundle is missing or not built from the current sources
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "packages" / "core"


def _builder():
    spec = importlib.util.spec_from_file_location("_stepscope_build_ui", CORE / "build_ui.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the bundle is built from the current sources")
    parser.add_argument("--force", action="store_true", help="build even when the bundle is current")
    args = parser.parse_args(argv)
    builder = _builder()
    if args.check:
        now = builder.state()
        print(f"build_ui: {now}")
        return 0 if now == "current" else 1
    if args.force:
        builder.build()
        done = "built"
    else:
        done = builder.ensure()
    sizes = ", ".join(f"{name} {(builder.STATIC / name).stat().st_size // 1024} KiB" for name in builder.bundle.FILES if (builder.STATIC / name).is_file())
    print(f"build_ui: {done}; {sizes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
