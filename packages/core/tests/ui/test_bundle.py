"""The web app's bundle: `stepscope ui` refuses to start without it (naming the command that
builds it) instead of serving a blank page; the app serves it; the record beside it says
whether it was built from the current ui-src."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from stepscope.cli import EXIT_ERROR, main
from stepscope.ui import bundle

from .conftest import PASSWORD, write_profiler_job

CORE = Path(__file__).resolve().parents[2]
IN_CHECKOUT = (CORE / "ui-src" / "package.json").is_file() and (CORE / "build_ui.py").is_file()


def _builder():
    spec = importlib.util.spec_from_file_location("_stepscope_build_ui_test", CORE / "build_ui.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ui_refuses_to_start_without_its_bundle(tmp_path, monkeypatch, capsys):
    write_profiler_job(tmp_path / "store" / "run-1", steps=3)
    empty = tmp_path / "static"
    empty.mkdir()
    (empty / "app.css").write_text("body{}")  # half a bundle is no bundle
    monkeypatch.setattr(bundle, "STATIC_DIR", empty)
    db = tmp_path / "users.db"

    assert main(["ui", str(tmp_path / "store"), "--port", "0", "--db", str(db)]) == EXIT_ERROR

    err = capsys.readouterr().err
    assert "app.js missing" in err and "app.css" not in err.split("missing")[0]
    assert "python scripts/build_ui.py" in err and "npm" in err
    assert not db.exists()  # refused before creating the first admin (its password would be lost)


def test_missing_message_names_each_absent_file(tmp_path):
    assert bundle.missing(tmp_path) == ["app.js", "app.css"]
    for name in bundle.FILES:
        (tmp_path / name).write_text("x")
    assert bundle.missing(tmp_path) == [] and bundle.missing_message(tmp_path) is None


@pytest.mark.skipif(bundle.missing() != [], reason="the bundle is not built in this installation")
def test_the_app_serves_its_bundle(tmp_path):
    from stepscope.ui.app import create_app
    from stepscope.ui.users import UserDB

    db = UserDB(tmp_path / "users.db", argon2_memory_kib=256, argon2_time_cost=1)
    db.add_user("admin", PASSWORD, admin=True)
    client = create_app(str(tmp_path), db).test_client()
    for name in bundle.FILES:
        response = client.get(f"/static/{name}")
        assert response.status_code == 200, name
        assert response.data == (bundle.STATIC_DIR / name).read_bytes()


@pytest.mark.skipif(not IN_CHECKOUT, reason="ui-src is only in a checkout")
def test_bundle_was_built_from_the_current_sources():
    """CI builds the bundle before the tests (nox); a bundle older than ui-src fails here."""
    assert _builder().state() == "current", "run `python scripts/build_ui.py`"


@pytest.mark.skipif(not IN_CHECKOUT, reason="ui-src is only in a checkout")
def test_sources_digest_follows_the_sources_not_node_modules(tmp_path):
    copy = tmp_path / "ui-src"
    shutil.copytree(CORE / "ui-src", copy, ignore=shutil.ignore_patterns("node_modules"))
    before = bundle.sources_digest(copy)
    (copy / "node_modules").mkdir()
    (copy / "node_modules" / "x.js").write_text("1")
    assert bundle.sources_digest(copy) == before
    main_js = copy / "src" / "main.js"
    main_js.write_text(main_js.read_text() + "\n// edited\n")
    edited = bundle.sources_digest(copy)
    assert edited != before
    main_js.rename(copy / "src" / "main2.js")  # a rename is a change too
    assert bundle.sources_digest(copy) not in (before, edited)


@pytest.mark.skipif(not IN_CHECKOUT, reason="ui-src is only in a checkout")
def test_state_sees_an_edited_bundle(tmp_path, monkeypatch):
    builder = _builder()
    static = tmp_path / "static"
    shutil.copytree(builder.STATIC, static)
    monkeypatch.setattr(builder, "STATIC", static)
    if builder.state() != "current":
        pytest.skip("the bundle in this checkout is not current")
    (static / "app.js").write_text((static / "app.js").read_text() + ";")
    assert builder.state() == "stale: app.js changed since it was built"
    (static / "app.js").unlink()
    assert builder.state() == "missing: app.js"


@pytest.mark.skipif(not IN_CHECKOUT, reason="the build hook is only in a checkout")
def test_a_build_without_npm_says_what_to_install(tmp_path, monkeypatch):
    builder = _builder()
    monkeypatch.setattr(builder, "STATIC", tmp_path)  # no bundle there
    monkeypatch.setenv("PATH", str(tmp_path / "no-npm-here"))
    monkeypatch.delenv(builder.SKIP_ENV, raising=False)
    with pytest.raises(SystemExit, match=r"needs npm.*apt-get install npm.*STEPSCOPE_SKIP_UI_BUILD=1"):
        builder.ensure()
    monkeypatch.setenv(builder.SKIP_ENV, "1")
    assert builder.ensure() == "skipped (STEPSCOPE_SKIP_UI_BUILD): missing: app.js, app.css"
