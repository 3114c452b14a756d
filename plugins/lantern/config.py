"""`lantern`'s config: its fields, their paper defaults and allowed ranges. No torch here: the CLI checks
`--set` against it before any model loads (the plugin itself is in plugin.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.config import DynamicTreeConfig, field_range

@dataclass
class EagleConfig(DynamicTreeConfig):
    num_draft_tokens: int = field_range(1, 64, default=4, doc="draft length K of a chain")
    tree_branching: str = ""  # e.g. "4,2,1,1": a static tree of the head's top-ranked tokens ("" = chain)
    head_path: str = ""  # a folder saved by EagleHead.save_pretrained ("" = the bundled head)


@dataclass
class LanternConfig(EagleConfig):
    k: int = field_range(1, None, default=32, doc="latent neighbours considered per draft token")
    delta: float = field_range(0.0, 1.0, default=0.1, doc="total-variation bound of the relaxed target")


@dataclass
class LanternPPConfig(EagleConfig):
    tree_branching: str = "4,2,1,1"
    k: int = field_range(1, None, default=10, doc="latent neighbours considered per draft token")
    lam: float = field_range(1.0, None, default=5.0, doc="cap of the relaxed probability, p~(x) <= lam * p(x)")
