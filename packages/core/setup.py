"""Build hooks only (the metadata is in pyproject.toml): every build of stepscope (wheel,
sdist, editable install) first makes sure the web app's bundle is built from the current
ui-src (build_ui.py), so that the app is there wherever stepscope is installed."""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_ui  # noqa: E402


class BuildPyWithApp(build_py):
    def run(self) -> None:
        print(f"stepscope: web app bundle {build_ui.ensure()}")
        self.__dict__.pop("data_files", None)  # listed again: the bundle's files may be new
        super().run()


class SdistWithApp(sdist):
    def run(self) -> None:
        print(f"stepscope: web app bundle {build_ui.ensure()}")
        super().run()


setup(cmdclass={"build_py": BuildPyWithApp, "sdist": SdistWithApp})
