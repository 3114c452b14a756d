"""The modality-free draft/verify core.

Its names load lazily (PEP 562): `import mmspec` and the light commands (`mmspec list`, `--help`,
`--version`) reach the registry without importing torch.
"""

import importlib

_EXPORTS = {
    "Acceptance": "accept", "AcceptRule": "accept", "Draft": "accept", "GreedyMatch": "accept",
    "SpeculativeSampling": "accept", "tree_accept": "accept",
    "GenerationOutput": "decoder", "SpeculativeDecoder": "decoder",
    "DraftModelDrafter": "draft", "Drafter": "draft", "StepContext": "draft",
    "LogitsPipeline": "logits",
    "ARModel": "model", "CFGModel": "model", "DecodeState": "model", "HFCausalLM": "model", "ModelOutput": "model",
    "cfg_combine": "model",
    "Plugin": "plugin",
    "field_choices": "registry", "field_range": "registry", "list_plugins": "registry", "load_plugin": "loading",
    "register_plugin": "registry",
    "DecodeStats": "stats",
    "TreeSpec": "tree",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
