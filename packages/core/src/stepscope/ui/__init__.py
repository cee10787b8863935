"""The web app: jobs, a dashboard, training health, a statistical summary and a timeline for
every job of a store, behind users with per-prefix access. `stepscope ui STORE` serves it;
`create_app(store, db)` builds the Flask application."""

from __future__ import annotations

from typing import Any


def create_app(*args: Any, **kwargs: Any) -> Any:
    from .app import create_app as _create

    return _create(*args, **kwargs)


__all__ = ["create_app"]
