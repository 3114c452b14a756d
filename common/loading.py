"""Loading what the registry names: bundled models, folders a pipeline's `save_pretrained` wrote, the plugin
saved in one, and `load_plugin` — a plugin attached to any of them.

It sits above the registry (which only records names) and the `Pipeline` base (which only generates): the
registry never loads, and a pipeline never looks a plugin up.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

from .config import PIPELINE_FILE, PLUGIN_FILE
from .registry import (ANY_MODALITY, bundled_model_info, bundled_models, get_pipeline_class, get_plugin_class,
                       pipeline_by_folder_marker)


def default_pipeline(plugin_cls, model: str | None = None, device: str = "cpu"):
    """The pipeline `plugin_cls` runs on when no pipeline is given: bundled model or saved folder `model`, or
    the plugin's default model (None: its modality's default)."""
    return load_bundled_pipeline(model if model is not None else plugin_cls.default_model, plugin_cls.modality,
                                 device)


def load_saved_plugin(directory: str | os.PathLike):
    """The plugin a pipeline's `save_plugin` wrote in `directory` (None when there is none: plain AR)."""
    path = Path(directory) / PLUGIN_FILE
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    config = dict(saved["config"])
    for key in saved.get("paths", ()):
        config[key] = str(Path(directory) / config[key])
    return get_plugin_class(saved["name"])(**config)


def load_plugin(name: str, pipeline=None, *, model: str | None = None, **config):
    """Return a ready pipeline decoding with plugin `name`.

    pipeline: your own pipeline (or None for a bundled one). A new pipeline sharing its components is
    returned; the one given keeps decoding as before.
    model: the bundled model to load when no pipeline is given (None: the plugin's default), e.g. "tts-tiny".
    config: plugin settings; unknown names and out-of-range values raise.
    """
    if pipeline is not None and model is not None:
        raise ValueError("give load_plugin either pipeline= or model=, not both")
    plugin = get_plugin_class(name)(**config)
    if pipeline is None:
        pipeline = default_pipeline(type(plugin), model)
    return plugin.attach(pipeline)


def saved_pipeline_name(directory) -> str:
    """The registered pipeline a `save_pretrained` folder holds (read from its files, nothing loaded)."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ValueError(f"model {str(directory)!r}: no such folder (a bundled model name, or a folder a pipeline's "
                         f"save_pretrained wrote; bundled: {', '.join(bundled_models())})")
    marker = folder / PIPELINE_FILE
    if marker.exists():
        return json.loads(marker.read_text())["pipeline"]
    marked = pipeline_by_folder_marker(folder)
    if marked is not None:
        return marked
    raise ValueError(f"model {str(directory)!r}: not a saved mmspec pipeline (no {PIPELINE_FILE}); write one "
                     "with pipe.save_pretrained(folder)")


def resolve_model(name: str | None, modality: str = ANY_MODALITY) -> tuple[str, str | None, bool]:
    """(model, pipeline name or None when not declared, is a saved folder) for `load_bundled_pipeline`'s
    arguments, checked without loading anything: an unknown name, or a bundled model of another modality than
    the plugin's, is one line here."""
    available = bundled_models(modality)
    if name is not None and name not in bundled_models() and _is_path(name):
        return name, saved_pipeline_name(name), True
    if not available:
        raise NotImplementedError(f"no bundled {modality} model is available yet")
    if name is None:
        name = available[0]
    if name not in available:
        what = "" if modality == ANY_MODALITY else f" for a {modality} plugin"
        raise ValueError(f"model must be one of {available}{what} or a saved pipeline's folder, got {name!r}")
    return name, bundled_model_info(name).pipeline, False


def load_saved_pipeline(directory, device: str = "cpu"):
    """The pipeline a `save_pretrained` call wrote into `directory` (any registered pipeline: the folder names
    it in `mmspec_pipeline.json`; without it, a pipeline's registered folder marker, such as a diffusers
    folder's model_index.json, does)."""
    pipeline = get_pipeline_class(saved_pipeline_name(directory)).from_saved(directory, device=device)
    pipeline.model_name = str(directory)
    return pipeline


def _is_path(name: str) -> bool:
    return os.sep in name or (os.altsep is not None and os.altsep in name) or os.path.exists(name)


def load_bundled_pipeline(name: str | None, modality: str = ANY_MODALITY, device: str = "cpu"):
    """The bundled pipeline `name` (None: the modality's default; modality "any": the project default), or the
    pipeline saved in folder `name` (`load_saved_pipeline`)."""
    name, _, saved = resolve_model(name, modality)
    if saved:
        return load_saved_pipeline(name, device)
    factory = bundled_model_info(name).factory
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    pipeline = factory(device)
    pipeline.model_name = name
    return pipeline
