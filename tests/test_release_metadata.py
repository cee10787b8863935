"""The README's supported-versions table says what the packages declare and what CI pins:
each row is checked against the packages' pyproject.toml, constraints/ci.txt and the
noxfile, so that a new pin or range cannot leave the table behind."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info < (3, 11):
    pytest.skip("tomllib is Python 3.11+", allow_module_level=True)
import tomllib

ROOT = Path(__file__).resolve().parent.parent
# README row -> (package folder, requirement name, extra or None), constraints/ci.txt name
ROWS = {
    "torch": (("torch_plugin", "torch", None), "torch"),
    "TensorFlow": (("tf_plugin", "tensorflow", "tf"), "tensorflow-cpu"),
    "Keras": (("tf_plugin", "keras", None), "keras"),
    "Lightning": (("torch_plugin", "lightning", "lightning"), "lightning"),
    "transformers": (("torch_plugin", "transformers", "hf"), "transformers"),
}


def _table() -> dict[str, tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Supported versions", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] and not set(cells[0]) <= {"-"}:
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints" / "ci.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def _declared(package: str, name: str, extra: str | None) -> str:
    project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]
    requirements = project["optional-dependencies"][extra] if extra else project["dependencies"]
    for requirement in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(\[[^\]]*\])?\s*(.*)", requirement)
        assert match, requirement
        if match.group(1).lower() == name:
            return match.group(3).replace(" ", "")
    raise AssertionError(f"{package}/pyproject.toml declares no {name} in {extra or 'dependencies'}")


def test_table_has_every_row():
    assert set(_table()) == {"Python", *ROWS}


@pytest.mark.parametrize("row", sorted(ROWS))
def test_row_agrees_with_pyproject_and_pins(row):
    supported, tested = _table()[row]
    declared_in, pin_name = ROWS[row]
    if declared_in is not None:
        declared = _declared(*declared_in)
        assert supported.split()[0] == declared, f"README says {row} {supported}; the pyproject.toml declares {declared}"
    pin = _pins().get(pin_name)
    if pin is None:
        assert tested == "not tested", f"README says {row} is tested at {tested}, but constraints/ci.txt pins no {pin_name}"
    else:
        assert tested.split()[0] == pin, f"README says {row} {tested} in CI; constraints/ci.txt pins {pin_name}=={pin}"


def test_python_row_agrees_with_requires_python_and_the_noxfile():
    supported, tested = _table()["Python"]
    for package in ("core", "torch_plugin", "tf_plugin"):
        project = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())["project"]
        assert supported.split()[0] == project["requires-python"], package
    noxfile = (ROOT / "noxfile.py").read_text()
    default = re.search(r'STEPSCOPE_NOX_PYTHON", "([0-9.]+)"', noxfile)
    assert default and tested == default.group(1)
    # the range in brackets is the cibuildwheel matrix of the compiled torch plugin
    low, high = re.fullmatch(r">=3\.(\d+) \(3\.(\d+)-3\.(\d+)\)", supported).group(2, 3)  # type: ignore[union-attr]
    build = tomllib.loads((ROOT / "packages" / "torch_plugin" / "pyproject.toml").read_text())["tool"]["cibuildwheel"]["build"]
    assert build.split() == [f"cp3{minor}-*" for minor in range(int(low), int(high) + 1)]


def test_one_version_for_the_three_packages():
    """Released together (CHANGELOG.md): one version in each pyproject.toml and __init__.py,
    and each plugin requires core's minor version."""
    packages = {"core": "stepscope", "torch_plugin": "stepscope_torch", "tf_plugin": "stepscope_tf"}
    versions = set()
    for folder, module in packages.items():
        project = tomllib.loads((ROOT / "packages" / folder / "pyproject.toml").read_text())["project"]
        init = (ROOT / "packages" / folder / "src" / module / "__init__.py").read_text()
        declared = re.search(r'^__version__ = "([^"]+)"', init, re.M)
        assert declared and declared.group(1) == project["version"], f"{module}.__version__ and {folder}/pyproject.toml differ"
        versions.add(project["version"])
    assert len(versions) == 1, versions
    major, minor = (int(part) for part in versions.pop().split(".")[:2])
    for folder in ("torch_plugin", "tf_plugin"):
        assert _declared(folder, "stepscope", None) == f">={major}.{minor},<{major}.{minor + 1}", folder
