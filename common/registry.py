"""Registries: plugins, pipelines and bundled models, with entry-point discovery for third parties.

- `@register_plugin("name")` registers a Plugin subclass; `list_plugins`, `load_plugin`.
- `register_pipeline("name", cls)` registers a Pipeline class (what `from_pretrained` folders, bench
  sections and CLI flags are looked up by).
- `register_bundled_model("name", factory, modality=...)` makes a ready pipeline loadable by name
  (`--model NAME`, a plugin's default); the factory may be "module:function", imported when first used.

Nothing here names a modality: the package's own modalities register themselves from modules the
package lists (`register_builtin_modules`, called by `mmspec/__init__.py`), third parties through the
entry-point groups `mmspec.plugins` and `mmspec.pipelines` (an entry point names a class to register
under its name, or a module that registers things on import).

A plugin's config is a dataclass; its fields' metadata give the allowed range (`range=(lo, hi)`) or
values (`choices=...`) so bad values fail with an error naming the field.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from dataclasses import dataclass
from typing import Any

from .config import (PIPELINE_FILE, field_choices, field_range, make_config, parse_value,  # noqa: F401
                     validate_config)

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "mmspec.plugins"
PIPELINE_ENTRY_POINT_GROUP = "mmspec.pipelines"
ANY_MODALITY = "any"  # a plugin of this modality runs on every pipeline whose structure it accepts


@dataclass
class BundledModel:
    name: str
    modality: str
    factory: Any  # callable(device) -> pipeline, or "module:function"
    default: bool = False  # the modality's default model
    project_default: bool = False  # the default of modality-free plugins (`ar`)
    bench_ar_rows: tuple = ()  # call settings of the plain-AR rows `bench --all` documents this model with
    pipeline: str | None = None  # the registered pipeline its factory builds (the CLI reads its spec before loading)


@dataclass(frozen=True)
class PluginSummary:
    """What is known of a plugin without importing its module (and so without torch): what `mmspec list` prints,
    the module that registers it (imported when the plugin is first used), its config class ("module:Class", in
    a module with no torch: the CLI checks `--set` against it first) and the bundled model it runs on by default."""
    name: str
    modality: str
    lossless: bool
    paper: str
    module: str | None = None  # imports and registers the plugin class (None: registered some other way)
    config: str | None = None  # "module:Class" of its config dataclass (None: no settings)
    default_model: str | None = None  # None: its modality's default bundled model
    method: str = ""  # one line on what it does (the README's plugin table)
    lossless_text: str | None = None  # the table's lossless cell where yes / no says too little ("strict: yes")

    def config_class(self) -> type:
        """The config dataclass, imported without torch."""
        if self.config is None:
            from .config import NoConfig

            return NoConfig
        module, _, attr = self.config.partition(":")
        return getattr(importlib.import_module(module), attr)


_REGISTRY: dict[str, type] = {}
_SUMMARIES: dict[str, PluginSummary] = {}  # declared by the package for its own plugins
_PIPELINES: dict[str, type] = {}
_PIPELINE_SPECS: dict[str, object] = {}  # pipeline name -> PipelineSpec, or "module:NAME" imported when first used
_FOLDER_MARKERS: dict[str, str] = {}  # file name -> pipeline name, for saved folders without PIPELINE_FILE
_BUNDLED: dict[str, BundledModel] = {}
_BUILTIN_MODULES: list[str] = []
_ENTRY_POINT_ERRORS: dict[str, str] = {}
_discovered = False


def _check_name(kind: str, name) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} name must be a non-empty string, got {name!r}")


def register_plugin(name: str):
    """Class decorator: register a Plugin subclass under `name`."""

    def wrap(cls):
        _check_name("plugin", name)
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"plugin {name!r} is already registered by {_REGISTRY[name].__module__}")
        for attr in ("modality", "lossless", "paper", "Config"):
            if not hasattr(cls, attr):
                raise TypeError(f"plugin {name!r} must define class attribute {attr!r}")
        if not isinstance(cls.modality, str) or not cls.modality:
            raise ValueError(f"plugin {name!r}: modality must be a non-empty string (a label such as 'text', "
                             f"or {ANY_MODALITY!r}), got {cls.modality!r}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def register_pipeline(name: str, cls, spec=None, folder_marker: str | None = None) -> None:
    """Register a Pipeline subclass under `name`; `cls` may be "module:Class", imported when first used
    (a modality's package registers on import without pulling in its heavy dependencies). `spec`: its
    `PipelineSpec` (or "module:NAME" in a module with no torch), what the CLI checks before the pipeline loads.
    folder_marker: a file whose presence makes a saved folder without `PIPELINE_FILE` this pipeline's (e.g. a
    diffusers folder's model_index.json)."""
    _check_name("pipeline", name)
    if folder_marker is not None:
        claimed = _FOLDER_MARKERS.get(folder_marker, name)
        if claimed != name:
            raise ValueError(f"pipeline {name!r}: folder marker {folder_marker!r} is already pipeline {claimed!r}'s")
        _FOLDER_MARKERS[folder_marker] = name
    if spec is not None and not (isinstance(spec, str) and ":" in spec) and not hasattr(spec, "call_settings"):
        raise TypeError(f"pipeline {name!r}: spec must be a PipelineSpec or 'module:NAME', got {spec!r}")
    if isinstance(cls, str):
        if ":" not in cls:
            raise ValueError(f"pipeline {name!r}: a lazy class must be 'module:Class', got {cls!r}")
    else:
        _check_pipeline_class(name, cls)
    current = _PIPELINES.get(name)
    if current is not None and current != cls and not (isinstance(current, type) and isinstance(cls, str)
                                                        and f"{current.__module__}:{current.__name__}" == cls):
        raise ValueError(f"pipeline {name!r} is already registered ({current})")
    _PIPELINES[name] = cls
    if spec is not None:
        _PIPELINE_SPECS[name] = spec


def _check_pipeline_class(name: str, cls) -> None:
    from .pipeline import Pipeline

    if not (isinstance(cls, type) and issubclass(cls, Pipeline)):
        raise TypeError(f"pipeline {name!r} must be a subclass of mmspec.common.pipeline.Pipeline, got {cls!r}")
    if not isinstance(cls.modality, str) or not cls.modality or cls.modality == ANY_MODALITY:
        raise ValueError(f"pipeline {name!r}: modality must be a non-empty label other than {ANY_MODALITY!r}, "
                         f"got {cls.modality!r}")
    if cls.__dict__.get("pipeline_name") not in (None, "", name):
        raise ValueError(f"pipeline class {cls.__name__} names itself {cls.pipeline_name!r}, not {name!r}")
    cls.pipeline_name = name


def register_bundled_model(name: str, factory, *, modality: str, default: bool = False,
                           project_default: bool = False, bench_ar_rows: tuple = (), pipeline: str | None = None) -> None:
    """Make a ready pipeline loadable by name (`--model NAME`).

    factory: callable(device) -> pipeline, or "module:function" to import only when first used.
    default: the modality's default model (else the first one registered for it is);
    project_default: what modality-free plugins such as `ar` run on when no model is named;
    bench_ar_rows: call settings (dicts) of plain-AR rows that document the model's own quality;
    pipeline: the registered pipeline name the factory builds (lets the CLI check inputs before it loads).
    """
    _check_name("bundled model", name)
    if not isinstance(modality, str) or not modality or modality == ANY_MODALITY:
        raise ValueError(f"bundled model {name!r}: modality must be a non-empty label other than "
                         f"{ANY_MODALITY!r}, got {modality!r}")
    if not (callable(factory) or (isinstance(factory, str) and ":" in factory)):
        raise TypeError(f"bundled model {name!r}: factory must be callable or 'module:function', got {factory!r}")
    _BUNDLED[name] = BundledModel(name, modality, factory, default, project_default, tuple(bench_ar_rows), pipeline)


def register_builtin_modules(*modules: str) -> None:
    """Modules imported on first use of a registry: the package's own modalities, which register their
    pipelines and bundled models without importing torch. (Its plugins are declared by `PluginSummary`, each
    module imported when that plugin is first used.)"""
    global _discovered
    for module in modules:
        if module not in _BUILTIN_MODULES:
            _BUILTIN_MODULES.append(module)
            _discovered = False


def declare_plugin_summaries(*summaries: PluginSummary) -> None:
    """The package's own plugins, described without importing them (a test checks each against its class)."""
    for summary in summaries:
        _SUMMARIES[summary.name] = summary


def plugin_summaries(modality: str | None = None) -> list[PluginSummary]:
    """Every plugin's name, modality, lossless flag and paper, sorted by name. The package's own plugins are
    not imported (so this answers without loading torch); third-party entry points are loaded."""
    summaries = dict(_SUMMARIES)
    undeclared = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name not in summaries]
    if undeclared:
        _load_entry_points(ENTRY_POINT_GROUP, _register_plugin_entry)
    for name, cls in _REGISTRY.items():  # third parties' and those registered in this process
        summaries.setdefault(name, PluginSummary(name, cls.modality, bool(cls.lossless), cls.paper,
                                                 default_model=cls.default_model))
    if modality is not None:
        known = sorted({s.modality for s in summaries.values()} - {ANY_MODALITY})
        if modality not in known:
            raise ValueError(f"--modality must be one of {known}, got {modality!r}")
    return [summaries[name] for name in sorted(summaries)
            if modality is None or summaries[name].modality in (modality, ANY_MODALITY)]


def _load_entry_points(group: str, register) -> None:
    for ep in importlib.metadata.entry_points(group=group):
        try:
            obj = ep.load()
            if isinstance(obj, type):
                register(ep.name, obj)
        except Exception as exc:  # a broken third-party package must not break the others
            _ENTRY_POINT_ERRORS[ep.name] = f"{type(exc).__name__}: {exc}"
            logger.warning("could not load %s entry point %r from %s: %s", group, ep.name, ep.value, exc)


def _register_plugin_entry(name: str, cls: type) -> None:
    if cls not in _REGISTRY.values():
        register_plugin(name)(cls)


def _register_pipeline_entry(name: str, cls: type) -> None:
    if cls not in _PIPELINES.values():
        register_pipeline(name, cls)


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)
    _load_entry_points(PIPELINE_ENTRY_POINT_GROUP, _register_pipeline_entry)
    _load_entry_points(ENTRY_POINT_GROUP, _register_plugin_entry)


def refresh_plugins() -> None:
    """Re-scan entry points (e.g. after installing a plugin or pipeline package in this process)."""
    global _discovered
    _discovered = False
    _ENTRY_POINT_ERRORS.clear()
    _discover()


def modalities() -> list[str]:
    """Every modality label a registered plugin, pipeline or bundled model uses."""
    _discover()
    labels = {s.modality for s in plugin_summaries()} | {m.modality for m in _BUNDLED.values()}
    return sorted(labels | {c.modality for c in _PIPELINES.values() if isinstance(c, type)})


def _check_modality(modality: str) -> None:
    known = modalities()
    if modality not in known:
        raise ValueError(f"modality must be one of {known}, got {modality!r}")


def list_plugins(modality: str | None = None) -> list[str]:
    """Every plugin's name (of one modality, with the modality-free ones), without importing any of them."""
    _discover()
    if modality is not None:
        _check_modality(modality)
    return [s.name for s in plugin_summaries() if modality is None or s.modality in (modality, ANY_MODALITY)]


def _registered(kind: str, table: dict, name: str):
    """table[name], or the entry point's load error, or a KeyError listing what is registered."""
    _discover()
    if name not in table:
        if name in _ENTRY_POINT_ERRORS:
            raise ImportError(f"{kind} {name!r} failed to load: {_ENTRY_POINT_ERRORS[name]}")
        raise KeyError(f"unknown {kind} {name!r}; available: {', '.join(sorted(table))}")
    return table[name]


def get_plugin_class(name: str) -> type:
    """The plugin class registered as `name`, its module imported now if the package declares it."""
    declared = _SUMMARIES.get(name)
    if name not in _REGISTRY and declared is not None and declared.module is not None:
        importlib.import_module(declared.module)
    _discover()
    if name not in _REGISTRY and name not in _ENTRY_POINT_ERRORS:
        raise KeyError(f"unknown plugin {name!r}; available: {', '.join(s.name for s in plugin_summaries())}")
    return _registered("plugin", _REGISTRY, name)


def list_pipelines() -> list[str]:
    _discover()
    return sorted(_PIPELINES)


def get_pipeline_class(name: str) -> type:
    cls = _registered("pipeline", _PIPELINES, name)
    if isinstance(cls, str):
        module, _, attr = cls.partition(":")
        cls = getattr(importlib.import_module(module), attr)
        _check_pipeline_class(name, cls)
        _PIPELINES[name] = cls
    return cls


def bundled_models(modality: str | None = None) -> list[str]:
    """Bundled model names, the modality's default first (modality "any" or None: all of them)."""
    _discover()
    models = [m for m in _BUNDLED.values() if modality in (None, ANY_MODALITY, m.modality)]
    models.sort(key=lambda m: not (m.project_default if modality in (None, ANY_MODALITY) else m.default))
    return [m.name for m in models]


def bundled_model_info(name: str) -> BundledModel:
    _discover()
    if name not in _BUNDLED:
        raise KeyError(f"unknown bundled model {name!r}; available: {', '.join(bundled_models())}")
    return _BUNDLED[name]


def pipeline_spec(name: str):
    """The `PipelineSpec` registered with pipeline `name` (None: none was), imported without torch."""
    _discover()
    spec = _PIPELINE_SPECS.get(name)
    if isinstance(spec, str):
        module, _, attr = spec.partition(":")
        spec = _PIPELINE_SPECS[name] = getattr(importlib.import_module(module), attr)
    return spec


def pipeline_class_name(name: str) -> str:
    """The class name of registered pipeline `name`, without importing it (for messages)."""
    _discover()
    cls = _registered("pipeline", _PIPELINES, name)
    return cls.rpartition(":")[2] if isinstance(cls, str) else cls.__name__


def pipeline_by_folder_marker(folder) -> str | None:
    """The registered pipeline whose folder marker `folder` holds (None: none does)."""
    _discover()
    for marker, name in _FOLDER_MARKERS.items():
        if (folder / marker).exists():
            return name
    return None
