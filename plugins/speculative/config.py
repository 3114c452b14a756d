"""`speculative`'s config: its fields, their paper defaults and allowed ranges. No torch here: the CLI checks
`--set` against it before any model loads (the plugin itself is in plugin.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.config import DynamicTreeConfig, field_range

@dataclass
class SpeculativeConfig(DynamicTreeConfig):
    num_draft_tokens: int = field_range(1, 64, default=5, doc="draft length K of a chain")
    tree_branching: str = ""  # e.g. "3,2,1": a static tree instead of a chain ("" = chain)
