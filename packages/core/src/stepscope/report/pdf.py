"""`--pdf`: the HTML report printed by headless Chromium (`--print-to-pdf`), so the PDF is
exactly what the print stylesheet gives."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from ..exceptions import ConfigError

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
CHROMIUM_ENV = "STEPSCOPE_CHROMIUM"


def find_chromium() -> str | None:
    """$STEPSCOPE_CHROMIUM, else the first Chromium or Chrome on PATH."""
    explicit = os.environ.get(CHROMIUM_ENV)
    if explicit:
        return explicit
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def html_to_pdf(html_path: str, pdf_path: str, timeout_s: float = 120.0) -> str:
    """Print `html_path` to `pdf_path` with headless Chromium; return `pdf_path`."""
    browser = find_chromium()
    if browser is None:
        raise ConfigError(f"--pdf needs Chromium or Chrome (install Debian's `chromium`, or set ${CHROMIUM_ENV} to the browser)")
    with tempfile.TemporaryDirectory(prefix="stepscope-chromium-") as profile:
        command = [
            browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
            f"--user-data-dir={profile}", "--no-pdf-header-footer", f"--print-to-pdf={os.path.abspath(pdf_path)}",
            "file://" + os.path.abspath(html_path),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"Chromium did not print the report within {timeout_s:.0f} s") from None
    if done.returncode != 0 or not os.path.exists(pdf_path):
        raise ConfigError(f"Chromium failed to print the report (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    return pdf_path
