"""`zipar`'s config: its fields, their paper defaults and allowed ranges. No torch here: the CLI checks
`--set` against it before any model loads (the plugin itself is in plugin.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.config import field_choices, field_range

@dataclass
class ZipARConfig:
    window: int = field_range(1, None, default=8,
                              doc="tokens row r−1 must have before row r starts (grid width: plain AR)")
    mode: str = field_choices(("lossy", "verified"), default="lossy",
                              doc="lossy: parallel tokens are output (ZipAR); verified: they are drafts the "
                                  "AR distribution must accept (lossless, see verified.py)")
