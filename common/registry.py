"""Plugin registry: `@register_plugin`, `list_plugins`, `load_plugin`, entry-point discovery.

A plugin is a class with a config dataclass; its fields' metadata give the
allowed range (`range=(lo, hi)`) or values (`choices=...`) so bad values fail
with an error naming the field. Third-party packages add plugins through the
entry-point group `mmspec.plugins` (the entry point may name a plugin class or
a module that registers plugins on import).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import math
from typing import Any

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "mmspec.plugins"
BUILTIN_MODULES = ("mmspec.common.textlm", "mmspec.plugins.ar", "mmspec.plugins.speculative",
                   "mmspec.plugins.jacobi", "mmspec.plugins.zipar",
                   "mmspec.plugins.ssd", "mmspec.plugins.lantern", "mmspec.plugins.ctc_draft")
MODALITIES = ("any", "text", "vision", "speech", "docs")
# What modality-free plugins (`ar`) run on when no model is named: the main bundled job.
PROJECT_DEFAULT_MODEL = "llamagen-tiny"
# Bundled pipelines registered lazily (importing their modules pulls in diffusers).
LAZY_BUNDLED = {"llamagen-tiny": ("vision", "mmspec.vision.pipeline:bundled_pipeline"),
                "asr-tiny": ("speech", "mmspec.speech.pipeline:bundled_pipeline"),
                "whisper-tiny-random": ("speech", "mmspec.speech.hf:tiny_random_pipeline")}

_REGISTRY: dict[str, type] = {}
_BUNDLED: dict[str, tuple[str, Any]] = {}  # model name -> (modality, factory(device) -> pipeline)
_ENTRY_POINT_ERRORS: dict[str, str] = {}
_discovered = False


def register_plugin(name: str):
    """Class decorator: register a Plugin subclass under `name`."""

    def wrap(cls):
        if not isinstance(name, str) or not name:
            raise ValueError("plugin name must be a non-empty string")
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"plugin {name!r} is already registered by {_REGISTRY[name].__module__}")
        for attr in ("modality", "lossless", "paper", "Config"):
            if not hasattr(cls, attr):
                raise TypeError(f"plugin {name!r} must define class attribute {attr!r}")
        if cls.modality not in MODALITIES:
            raise ValueError(f"plugin {name!r}: modality must be one of {MODALITIES}, got {cls.modality!r}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    for name, (modality, factory) in LAZY_BUNDLED.items():
        register_bundled_model(name, modality, factory)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if isinstance(obj, type) and obj not in _REGISTRY.values():
                register_plugin(ep.name)(obj)
        except Exception as exc:  # a broken third-party plugin must not break the others
            _ENTRY_POINT_ERRORS[ep.name] = f"{type(exc).__name__}: {exc}"
            logger.warning("could not load mmspec plugin %r from %s: %s", ep.name, ep.value, exc)


def refresh_plugins() -> None:
    """Re-scan entry points (e.g. after installing a plugin package in this process)."""
    global _discovered
    _discovered = False
    _ENTRY_POINT_ERRORS.clear()
    _discover()


def list_plugins(modality: str | None = None) -> list[str]:
    _discover()
    if modality is not None and modality not in MODALITIES:
        raise ValueError(f"modality must be one of {MODALITIES}, got {modality!r}")
    return sorted(n for n, c in _REGISTRY.items()
                  if modality is None or c.modality in (modality, "any"))


def get_plugin_class(name: str) -> type:
    _discover()
    if name not in _REGISTRY:
        if name in _ENTRY_POINT_ERRORS:
            raise ImportError(f"plugin {name!r} failed to load: {_ENTRY_POINT_ERRORS[name]}")
        raise KeyError(f"unknown plugin {name!r}; available: {', '.join(list_plugins())}")
    return _REGISTRY[name]


def load_plugin(name: str, pipeline=None, **config):
    """Return a ready pipeline decoding with plugin `name`.

    pipeline: your own pipeline (or None for the plugin's bundled default).
    config: plugin settings; unknown names and out-of-range values raise.
    """
    plugin = get_plugin_class(name)(**config)
    if pipeline is None:
        pipeline = plugin.default_pipeline()
    return plugin.attach(pipeline)


def register_bundled_model(name: str, modality: str, factory) -> None:
    """Make a bundled pipeline loadable by name (`--model NAME`); the first of a modality is its default.

    factory: a callable(device) -> pipeline, or "module:function" to import only when first used.
    """
    if modality not in MODALITIES[1:]:
        raise ValueError(f"modality must be one of {MODALITIES[1:]}, got {modality!r}")
    _BUNDLED[name] = (modality, factory)


def bundled_models(modality: str | None = None) -> list[str]:
    _discover()
    return [n for n, (m, _) in _BUNDLED.items() if modality in (None, "any", m)]


def load_bundled_pipeline(name: str | None, modality: str, device: str = "cpu"):
    """The bundled pipeline `name` (None: the modality's default; "any": the project default)."""
    available = bundled_models(modality)
    if not available:
        raise NotImplementedError(f"no bundled {modality} model is available yet")
    if name is None:
        name = PROJECT_DEFAULT_MODEL if modality == "any" else available[0]
    if name not in available:
        raise ValueError(f"model must be one of {available} for a {modality} plugin, got {name!r}")
    factory = _BUNDLED[name][1]
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory(device)


def field_range(lo=None, hi=None, *, default, doc: str = "", lo_open: bool = False, hi_open: bool = False):
    """A dataclass field with an allowed numeric range (inclusive unless *_open)."""
    return dataclasses.field(default=default, metadata={"range": (lo, hi, lo_open, hi_open), "doc": doc})


def field_choices(choices, *, default, doc: str = ""):
    return dataclasses.field(default=default, metadata={"choices": tuple(choices), "doc": doc})


def _range_text(lo, hi, lo_open, hi_open) -> str:
    left = "(" if lo_open or lo is None else "["
    right = ")" if hi_open or hi is None else "]"
    return f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"


def validate_config(config) -> None:
    """Check every field of a config dataclass against its declared range or choices."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        meta = f.metadata
        if "choices" in meta and value not in meta["choices"]:
            raise ValueError(f"{type(config).__name__}.{f.name} must be one of {list(meta['choices'])}, "
                             f"got {value!r}")
        if "range" in meta and value is not None:
            lo, hi, lo_open, hi_open = meta["range"]
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = ok and not (isinstance(value, float) and math.isnan(value))
            if ok and lo is not None:
                ok = value > lo if lo_open else value >= lo
            if ok and hi is not None:
                ok = value < hi if hi_open else value <= hi
            if ok and isinstance(f.default, int) and not isinstance(f.default, bool) and not isinstance(value, int):
                ok = False
            if not ok:
                kind = "an int" if isinstance(f.default, int) and not isinstance(f.default, bool) else "a number"
                raise ValueError(f"{type(config).__name__}.{f.name} must be {kind} in "
                                 f"{_range_text(lo, hi, lo_open, hi_open)}, got {value!r}")


def make_config(config_cls, overrides: dict[str, Any]):
    names = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown} for {config_cls.__name__}; valid: {sorted(names)}")
    config = config_cls(**overrides)
    validate_config(config)
    return config


def parse_value(text: str):
    """Parse a `--set key=value` value: int, float, bool, None, or string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text
