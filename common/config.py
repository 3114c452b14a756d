"""Config dataclasses and their checks, with no torch: a plugin's config and a pipeline's call settings are
dataclasses whose fields' metadata give the allowed range (`range=(lo, hi)`) or values (`choices=...`), so a bad
value fails with one line naming the field, before any model loads (the CLI checks `--set` with these).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


# The files a pipeline's save_pretrained writes beside its weights: which registered pipeline the folder holds
# (read by the CLI before anything loads) and the attached plugin with its config.
PIPELINE_FILE = "mmspec_pipeline.json"
PLUGIN_FILE = "mmspec_plugin.json"


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


def parse_settings(pairs: list[str]) -> dict:
    """`--set key=value` pairs -> {key: parsed value}."""
    settings = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        settings[key.strip()] = parse_value(value.strip())
    return settings


def split_settings(call_defaults: dict, config_cls, plugin: str, settings: dict) -> tuple[dict, dict]:
    """Split `--set` values into pipeline call settings (`call_defaults` updated) and plugin config; a key that
    is neither is one line listing both."""
    call = dict(call_defaults)
    config_fields = {f.name for f in dataclasses.fields(config_cls)}
    config = {}
    for key, value in settings.items():
        if key in call:
            call[key] = value
        elif key in config_fields:
            config[key] = value
        else:
            raise ValueError(f"unknown --set key {key!r}; pipeline settings: {sorted(call)}, "
                             f"plugin {plugin!r} config: {sorted(config_fields)}")
    return call, config


def config_defaults(config_cls) -> dict:
    """{field: default} of a config dataclass (a pipeline's `call_defaults` from its call settings)."""
    return {f.name: f.default for f in dataclasses.fields(config_cls)}


@dataclass
class NoConfig:
    """The config of a plugin with no settings."""


@dataclass
class DynamicTreeConfig:
    """The EAGLE-2 settings a tree-drafting plugin's config carries (tree_depth 0: no dynamic tree)."""
    tree_depth: int = field_range(0, 16, default=0, doc="EAGLE-2 dynamic tree depth (0 = no dynamic tree)")
    tree_top_k: int = field_range(1, 64, default=4, doc="dynamic tree: children per expanded node and nodes "
                                  "expanded per level")
    tree_total_tokens: int = field_range(1, 1024, default=16, doc="dynamic tree: draft nodes verified per step")


# The sampling settings every pipeline's `__call__` takes, with the values `LogitsPipeline` accepts.
def temperature_field(default: float, doc: str = "sampling temperature (0 = greedy)"):
    return field_range(0.0, None, default=default, doc=doc)


def top_k_field(default: int | None, doc: str = "keep the k most likely tokens (None: all)"):
    return field_range(1, None, default=default, doc=doc)


def top_p_field(default: float | None, doc: str = "keep the smallest set of tokens with this much mass (None: all)"):
    return field_range(0.0, 1.0, lo_open=True, default=default, doc=doc)


def count_field(default: int | None, doc: str):
    """An int >= 1 (None allowed where the default is None)."""
    return field_range(1, None, default=default, doc=doc)
