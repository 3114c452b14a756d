"""`rvq_spec`'s config: its fields, their paper defaults and allowed ranges. No torch here: the CLI checks
`--set` against it before any model loads (the plugin itself is in plugin.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.config import field_range

@dataclass
class RVQSpecConfig:
    num_draft_tokens: int = field_range(1, None, default=4, doc="draft length D of a chain (at most K−2)")
    offsets: str = ""  # "" = the bundled offsets (trained on tts-tiny); "none" = head-ahead drafting; or a folder
    tree_branching: str = ""  # e.g. "3,1,1": a static tree, the top 3 codes at the first draft depth ("" = chain)
