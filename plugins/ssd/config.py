"""`ssd`'s config: its fields, their paper defaults and allowed ranges. No torch here: the CLI checks
`--set` against it before any model loads (the plugin itself is in plugin.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.config import field_range

@dataclass
class SSDConfig:
    num_draft_tokens: int = field_range(1, 64, default=3, doc="draft length K (must be < the grid width)")
    heads_path: str = ""  # a folder saved by SpatialHeads.save_pretrained ("" = the bundled heads)
    tree_branching: str = ""  # e.g. "4,2,1": a static tree of both heads' top candidates ("" = a chain of K)
