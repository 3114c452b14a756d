"""`ptp`'s config: its fields, their paper defaults and allowed ranges. No torch here: the CLI checks
`--set` against it before any model loads (the plugin itself is in plugin.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.config import field_range

MAX_K = 64  # the most registers (drafts per step) a register set may hold


@dataclass
class PTPConfig:
    num_draft_tokens: int = field_range(1, MAX_K, default=4, doc="drafts per step k (at most the registers trained)")
    copy_draft: int = field_range(0, MAX_K, default=0, doc="longest structure-copy draft (0: off; see RegisterDrafter)")
    registers_path: str = ""  # a folder saved by RegisterSet.save_pretrained ("" = the bundled doc-tiny registers)
