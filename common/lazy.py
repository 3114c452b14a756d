"""Packages whose names load on first use (PEP 562), so importing them, or a light module inside them, costs
nothing: a plugin package's `__init__` imports its torch-free config and takes every other name from its
plugin module when asked (`mmspec generate` checks `--set` against the config before torch loads)."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, module: str):
    """`__getattr__` for `package`: a name it does not define is looked up in `package.module`, imported then."""

    def __getattr__(name: str):
        if not name.startswith("__"):  # dunder probes (__path__, __wrapped__, ...) must not import the module
            value = getattr(importlib.import_module(f"{package}.{module}"), name, _MISSING)
            if value is not _MISSING:
                return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


_MISSING = object()
