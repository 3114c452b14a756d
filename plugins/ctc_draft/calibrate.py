"""Which CTC confidence tells a right hypothesis from a wrong one, and the gate threshold it needs.

`ctc_draft`'s gate skips the decoder when a statistic of the CTC posteriors is at most ``tau``. A statistic is
worth gating on as far as it ranks wrong hypotheses above right ones: its AUROC for "the hypothesis is wrong"
(0.5: no better than chance). `calibrate_tau` picks the largest ``tau`` at which gated hypotheses are wrong at
most a given share of the time, on data the threshold is then applied to unseen (calibrate on training
utterances, report on held-out sets: ``examples/calibrate_ctc_gate.py``).
"""

from __future__ import annotations

import numpy as np

from mmspec.speech.text import normalize_text

from .plugin import ctc_hypotheses

STATISTICS = ("max", "mean", "token")  # the `gate` values: max / mean frame entropy, least sure emitted token


def gate_records(recognizer, encoded, references: list[str]) -> list[dict]:
    """Per row of an encoded batch: each gate statistic, and whether the greedy CTC hypothesis is wrong
    (differs from the reference after the scoring normalisation)."""
    hyps = ctc_hypotheses(recognizer, encoded)
    if len(references) != len(hyps.ids):
        raise ValueError(f"{len(references)} references for a batch of {len(hyps.ids)}")
    records = []
    for b, reference in enumerate(references):
        text = recognizer.decoder_ids_to_text(hyps.ids[b])
        records.append({**{s: float(hyps.statistic(s)[b]) for s in STATISTICS},
                        "wrong": normalize_text(text) != normalize_text(reference)})
    return records


def auroc(scores, positives) -> float:
    """P(score of a positive > score of a negative), ties counted half (the Mann-Whitney AUROC)."""
    scores, positives = np.asarray(scores, dtype=np.float64), np.asarray(positives, dtype=bool)
    pos, neg = scores[positives], scores[~positives]
    if not len(pos) or not len(neg):
        raise ValueError(f"AUROC needs both classes, got {len(pos)} positives and {len(neg)} negatives")
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def calibrate_tau(records: list[dict], statistic: str, max_wrong_share: float) -> float | None:
    """The largest threshold at which the hypotheses the gate would take (statistic <= tau) are wrong at most
    ``max_wrong_share`` of the time; None if even the most confident one is wrong too often."""
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
    if not 0 <= max_wrong_share <= 1:
        raise ValueError(f"max_wrong_share must be in [0, 1], got {max_wrong_share}")
    ordered = sorted(records, key=lambda r: r[statistic])
    best, wrong = None, 0
    for i, record in enumerate(ordered):
        wrong += record["wrong"]
        last_of_tie = i + 1 == len(ordered) or ordered[i + 1][statistic] > record[statistic]
        if last_of_tie and wrong / (i + 1) <= max_wrong_share:
            best = record[statistic]
    return best


def gate_outcome(records: list[dict], statistic: str, tau: float | None) -> dict:
    """What a gate at ``tau`` does on ``records``: the share it takes and the share of those that are wrong."""
    taken = [r for r in records if tau is not None and r[statistic] <= tau]
    return {"gated": len(taken) / len(records),
            "wrong_among_gated": sum(r["wrong"] for r in taken) / len(taken) if taken else 0.0}
