"""A real headless Chromium (Debian's chromium + chromedriver, through Selenium) against the
app served by the app's own production server (waitress, `stepscope.ui.server`) on a
loopback port; screenshots go to ARTIFACTS."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def app_in_browser(store_root: Path, db_dir: Path, grants: dict[str, list[str]]) -> Iterator[tuple[LiveServer, object]]:
    """The app over the jobs under `store_root` (its bundle built first where a checkout
    lacks it), one user per `grants` entry (name -> job prefixes, the tests' PASSWORD), and a
    browser; both stopped on exit."""
    from stepscope.ui import bundle
    from stepscope.ui.app import create_app
    from stepscope.ui.jobs import JobStore
    from stepscope.ui.users import UserDB

    from .conftest import PASSWORD

    if bundle.missing():
        subprocess.run([sys.executable, str(REPO / "scripts" / "build_ui.py")], check=True)
    db = UserDB(db_dir / "users.db", argon2_memory_kib=256, argon2_time_cost=1)
    for name, prefixes in grants.items():
        db.add_user(name, PASSWORD, prefixes=prefixes)
    server = LiveServer(create_app(JobStore(str(store_root)), db))
    driver = start_browser()
    try:
        yield server, driver
    finally:
        quit_browser(driver)
        server.stop()


def sign_in(driver, url: str, name: str = "alice") -> None:
    """Sign in on the login page; returns once the jobs list has rows."""
    from .conftest import PASSWORD

    driver.get(url + "/login")
    driver.find_element("id", "username").send_keys(name)
    driver.find_element("id", "password").send_keys(PASSWORD)
    driver.find_element("id", "login").click()
    wait_for(lambda: driver.find_elements("css selector", "#jobs-table tbody tr"), what="jobs list")
