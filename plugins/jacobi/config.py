"""`jacobi`'s config: its fields, their paper defaults and allowed ranges. No torch here: the CLI checks
`--set` against it before any model loads (the plugin itself is in plugin.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.config import field_choices, field_range

# How tokens entering the window are drafted, and how a position's new draft is tied to its previous one
# (drafter.py says what each does).
INITS = ("random", "repeat_horizon", "sample_horizon", "vertical")
COUPLINGS = ("independent", "maximal", "gumbel")


@dataclass
class SJDConfig:
    window: int = field_range(1, 256, default=16, doc="draft tokens verified per forward (L)")
    init: str = field_choices(INITS, default="random", doc="how tokens entering the window are drafted")


@dataclass
class MCSJDConfig:
    window: int = field_range(1, 256, default=16, doc="draft tokens verified per forward (L)")
    init: str = field_choices(INITS, default="random", doc="how tokens entering the window are drafted")
    coupling: str = field_choices(("maximal", "gumbel"), default="maximal",
                                  doc="how a position's new draft is tied to its previous one")


@dataclass
class GSDConfig:
    window: int = field_range(1, 256, default=16, doc="draft tokens verified per forward (L)")
    init: str = field_choices(INITS, default="random", doc="how tokens entering the window are drafted")
    group_size: int = field_range(0, None, default=7, doc="rank half-width of the candidate group (0 = SJD)")
    prob_gap: float = field_range(0.0, 1.0, default=0.15, lo_open=True,
                                  doc="group members' target probability is within this of the draft's")
    embed_threshold: float = field_range(0.0, None, default=1.0,
                                         doc="group members' squared embedding distance to the draft, as a "
                                             "multiple of the median over code pairs (inf: no filter)")
