"""The modality-free draft/verify core."""

from .accept import Acceptance, AcceptRule, Draft, GreedyMatch, SpeculativeSampling, tree_accept
from .decoder import GenerationOutput, SpeculativeDecoder
from .draft import DraftModelDrafter, Drafter, StepContext
from .logits import LogitsPipeline
from .model import ARModel, CFGModel, DecodeState, HFCausalLM, ModelOutput, cfg_combine
from .plugin import Plugin
from .registry import field_choices, field_range, list_plugins, load_plugin, register_plugin
from .stats import DecodeStats
from .tree import TreeSpec

__all__ = [
    "Acceptance", "AcceptRule", "ARModel", "CFGModel", "DecodeState", "DecodeStats", "Draft",
    "DraftModelDrafter", "Drafter", "GenerationOutput", "GreedyMatch", "HFCausalLM", "LogitsPipeline",
    "ModelOutput", "Plugin", "SpeculativeDecoder", "SpeculativeSampling", "StepContext", "TreeSpec",
    "cfg_combine", "field_choices", "field_range", "list_plugins", "load_plugin", "register_plugin", "tree_accept",
]
