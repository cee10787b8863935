"""The set of collections a hook works with, and its JSON form (collections/<worker>_collections.json)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..config import BUILTIN_COLLECTIONS, Collection, ConfigError
from .scopes import Scope, parse_scopes


def _version() -> str:
    from .. import __version__

    return __version__


class CollectionManager:
    """Holds collections by name; built-in ones exist from the start (empty until a plugin
    gives them regexes). Unknown names are created on first use with `get(name, create=True)`."""

    def __init__(self, collections: Iterable[Collection] = (), *, builtin_regexes: Mapping[str, Iterable[str]] | None = None):
        self._collections: dict[str, Collection] = {}
        # tensor name -> class of the module it is an input/output of (written in `_meta`).
        self.module_classes: dict[str, str] = {}
        # scope name -> Scope (networks / optimizers the hook declared; written in `_meta`).
        self.scopes: dict[str, Scope] = {}
        for name in BUILTIN_COLLECTIONS:
            self._collections[name] = Collection(name, include_regex=tuple((builtin_regexes or {}).get(name, ())))
        for collection in collections:
            self.add(collection)

    def add(self, collection: Collection) -> Collection:
        existing = self._collections.get(collection.name)
        if existing is not None and not collection.include_regex and not collection.tensor_names:
            # A configuration that only changes save/reduction settings keeps the built-in regexes.
            existing.save_config = collection.save_config or existing.save_config
            existing.reduction_config = collection.reduction_config or existing.reduction_config
            existing.save_histogram = collection.save_histogram
            return existing
        self._collections[collection.name] = collection
        return collection

    def get(self, name: str, create: bool = False) -> Collection:
        if name not in self._collections:
            if not create:
                raise ConfigError(f"unknown collection {name!r}; known: {', '.join(sorted(self._collections))}")
            self._collections[name] = Collection(name)
        return self._collections[name]

    def __contains__(self, name: object) -> bool:
        return name in self._collections

    def __iter__(self) -> Iterator[Collection]:
        return iter(self._collections.values())

    def names(self) -> list[str]:
        return list(self._collections)

    def to_json(self, num_workers: int = 1) -> dict[str, Any]:
        meta: dict[str, Any] = {"num_workers": num_workers, "writer": f"stepscope {_version()}"}
        if self.module_classes:
            meta["module_classes"] = dict(sorted(self.module_classes.items()))
        if self.scopes:
            meta["scopes"] = [scope.to_json() for scope in self.scopes.values()]
        return {"collections": {c.name: c.to_json() for c in self._collections.values()}, "_meta": meta}

    def note_module_class(self, tensor_name: str, module_class: str) -> bool:
        """Record the class of the module (layer) whose input/output `tensor_name` is, so rules
        recognise activations by type (a ReLU's output named `net.1_output_0`). True when new."""
        if self.module_classes.get(tensor_name) == module_class:
            return False
        self.module_classes[tensor_name] = module_class
        return True

    def dumps(self, num_workers: int = 1) -> bytes:
        return json.dumps(self.to_json(num_workers), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CollectionManager:
        manager = cls()
        meta = data.get("_meta") or {}
        manager.module_classes.update(meta.get("module_classes") or {})
        manager.scopes.update((scope.name, scope) for scope in parse_scopes(meta.get("scopes"), "the collections file"))
        for body in (data.get("collections") or {}).values():
            manager._collections[body["name"]] = Collection.from_json(body)
        return manager
