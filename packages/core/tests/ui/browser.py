"""A real headless Chromium (Debian's chromium + chromedriver, through Selenium) against the
app served by the app's own production server (waitress, `stepscope.ui.server`) on a
loopback port; screenshots go to ARTIFACTS."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
ARTIFACTS = Path(os.environ.get("STEPSCOPE_TEST_ARTIFACTS") or REPO / "artifacts") / "ui"


def chromium_paths() -> tuple[str, str]:
    browser = os.environ.get("STEPSCOPE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = os.environ.get("STEPSCOPE_CHROMEDRIVER") or shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("no chromium/chromedriver on this machine (Debian: apt-get install chromium chromium-driver; nox -s tests installs them)")
    return browser, driver


class LiveServer:
    """The app on 127.0.0.1:<free port> in a thread, served as `stepscope ui` serves it."""

    def __init__(self, app, **server_options):
        from stepscope.ui.server import WebServer

        self.server = WebServer(app, "127.0.0.1", 0, **server_options)
        self.url = f"{'https' if self.server.tls else 'http'}://127.0.0.1:{self.server.port}"
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(5)


def start_browser(width: int = 1400, height: int = 1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    profile = tempfile.mkdtemp(prefix="stepscope-chromium-")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-dev-shm-usage", f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(arg)
    driver_obj = webdriver.Chrome(service=Service(driver), options=options)
    driver_obj.set_page_load_timeout(30)
    driver_obj._stepscope_profile = profile
    return driver_obj


def quit_browser(driver) -> None:
    driver.quit()
    shutil.rmtree(driver._stepscope_profile, ignore_errors=True)


def screenshot(driver, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    # the whole page, not only the window
    height = driver.execute_script("return Math.min(6000, document.documentElement.scrollHeight)")
    driver.set_window_size(1400, max(1000, int(height)))
    driver.save_screenshot(str(path))
    return path


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # the page may be between renders
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
