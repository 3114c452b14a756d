"""`ctc_draft`'s config: its fields, their defaults (measured: see the comments) and allowed ranges. No torch here:
the CLI checks `--set` against it before any model loads (the plugin itself is in plugin.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mmspec.common.config import field_choices, field_range

# Relaxed mode's gate when none is given, in nats of max-frame entropy; calibrated on the bundled model
# (see BENCHMARKS.md for the sweep).
RELAXED_DEFAULT_TAU = 1.0

# Default cap on a re-draft (``redraft_tokens``). A batch's verify pass is as wide as its widest row, so one row
# re-drafting a long, failing rest makes every row's pass wide. Measured (asr-tiny, strict, 48 clips, one run
# each): out-of-domain batch 8 0.77x (no cap) -> 0.96x (8) / 0.97x (16); in-domain batch 1 2.98x / 2.96x /
# 3.02x and batch 8 1.78x / 1.84x / 1.91x: a re-draft after a slip rarely needs more than 16 tokens.
REDRAFT_TOKENS = 16
# Default ``max_draft_entropy``: a row whose mean CTC frame entropy (nats) is above it drafts nothing and runs as
# plain AR. Such posteriors spell junk: on the bench sets (asr-tiny, 120 clips each) the mean entropy's 10th /
# 50th / 90th percentiles are 1.22 / 2.38 / 2.67 on noise, but 0.19 / 0.27 / 0.38 in-domain, 0.31 / 0.48 / 0.79
# out-of-domain and 0.47 / 0.58 / 0.71 on German, whose drafts still pay. Drafting only changes speed: lossless
# at any value (None: never skip).
MAX_DRAFT_ENTROPY = 1.0
# Default ``refill_admit_fraction``: continuous batching admits utterances once this share of the batch's places
# is free. A row's first draft is its whole hypothesis (~40 tokens), later ones at most REDRAFT_TOKENS; admitted
# one at a time, each new row widens another step for the whole batch, which a CPU pays in full. Measured
# (asr-tiny, strict, batch 8, 48 clips, refill vs plain batches): at once 0.85x in-domain / 0.93x out-of-domain;
# 0.375: 0.96x / 1.00x; 0.5: 0.98x / 1.03x; 0.75: 1.03x / 1.05x (AR gains 1.20x / 1.30x from refill).
REFILL_ADMIT_FRACTION = 0.75


@dataclass
class CTCDraftConfig:
    mode: str = field_choices(("strict", "relaxed", "ctc"), default="strict",
                              doc="strict: lossless greedy verification; relaxed: probability floor; "
                                  "ctc: CTC hypotheses only")
    tau: float | str | None = dataclasses.field(default="auto", metadata={
        "doc": "entropy gate in nats: a number >= 0, None (off) or 'auto' (off for strict, "
               "RELAXED_DEFAULT_TAU for relaxed)"})
    gate: str = field_choices(("max", "mean", "token"), default="max",
                              doc="statistic the gate reads: max or mean frame entropy, or token: −log of "
                                  "the least sure emitted token's posterior")
    floor: float = field_range(0.0, 1.0, default=0.1, doc="relaxed mode: decoder probability floor")
    resync: bool = field_choices((True, False), default=True,
                                 doc="after a rejected token, draft the rest of the CTC hypothesis again "
                                     "(aligned past the correction) instead of finishing in AR")
    redraft_tokens: int = field_range(0, 4096, default=REDRAFT_TOKENS,
                                      doc="with resync: the longest re-draft after a row's first verify "
                                          "pass (0: the whole rest of the hypothesis); a short re-draft "
                                          "keeps a batch's verify passes narrow")
    max_draft_entropy: float | None = field_range(0.0, None, default=MAX_DRAFT_ENTROPY,
                                                 doc="a row whose mean CTC frame entropy (nats) is above "
                                                     "this drafts nothing (plain AR: noise, no speech); "
                                                     "None: always draft")
    refill_admit_fraction: float = field_range(0.0, 1.0, default=REFILL_ADMIT_FRACTION,
                                               doc="continuous batching (max_batch_size): admit waiting "
                                                   "utterances once this share of the batch is free, so "
                                                   "their wide first passes are shared (0: at once, best "
                                                   "where a wide step costs about a narrow one, e.g. a GPU)")
    backoff: bool = field_choices((True, False), default=True,
                                  doc="with resync: after two poor verify passes in a row, draft short "
                                      "probes with growing pauses, so poor hypotheses cost about what "
                                      "AR does")

    def __post_init__(self):
        tau = self.tau
        number = isinstance(tau, (int, float)) and not isinstance(tau, bool) and tau >= 0  # False for NaN
        if not (tau is None or tau == "auto" or number):
            raise ValueError(f"{type(self).__name__}.tau must be a number >= 0, None (gate off) or 'auto', got {tau!r}")
