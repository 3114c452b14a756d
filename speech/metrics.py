"""ASR quality and speed metrics: WER / CER with jiwer after `normalize_text`, real-time factors."""

from __future__ import annotations

import jiwer

from .text import normalize_text


def error_rates(references: list[str], hypotheses: list[str]) -> dict:
    """Corpus WER and CER (errors / reference words or characters) after the scoring normalisation.

    An empty normalised hypothesis counts as all deletions; references must not be empty.
    """
    return rates_of(error_counts(references, hypotheses))


def error_counts(references: list[str], hypotheses: list[str]) -> dict:
    """Per utterance (errors, reference length) for WER and CER, after the scoring normalisation: what a
    bootstrap of the corpus rates resamples; `rates_of` sums them into `error_rates`."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    refs = [normalize_text(r) for r in references]
    if any(not r for r in refs):
        raise ValueError("a reference transcript is empty after normalisation")
    hyps = [normalize_text(h) for h in hypotheses]
    words = [jiwer.process_words(r, h) for r, h in zip(refs, hyps)]
    chars = [jiwer.process_characters(r, h) for r, h in zip(refs, hyps)]
    return {
        "wer": ([w.substitutions + w.deletions + w.insertions for w in words], [len(r.split()) for r in refs]),
        "cer": ([c.substitutions + c.deletions + c.insertions for c in chars], [len(r) for r in refs]),
    }


def rates_of(counts: dict) -> dict:
    """{metric: Σ errors / Σ reference lengths} of `error_counts`."""
    return {metric: sum(errors) / sum(lengths) for metric, (errors, lengths) in counts.items()}


def real_time_factor(compute_seconds: float, audio_seconds: float) -> float:
    """Compute time per second of audio (< 1: faster than real time)."""
    if audio_seconds <= 0:
        raise ValueError(f"audio_seconds must be > 0, got {audio_seconds}")
    return compute_seconds / audio_seconds


def inverse_real_time_factor(compute_seconds: float, audio_seconds: float) -> float:
    """Seconds of audio per second of compute (RTFx; larger is faster)."""
    if compute_seconds <= 0:
        raise ValueError(f"compute_seconds must be > 0, got {compute_seconds}")
    return audio_seconds / compute_seconds
