"""Long-form ASR: recordings with several sentences, or longer than the model takes, are split at pauses and
transcribed completely (AR and every ctc_draft mode); silent, tiny and cut-short inputs say so."""

import jiwer
import numpy as np
import pytest
import soundfile
import torch

from mmspec import load_plugin
from mmspec.speech.data import load_test_set
from mmspec.speech.segment import split_utterances

ROWS = load_test_set()


def clip(i):
    return soundfile.read(ROWS[i]["audio"], dtype="float32")[0]


def recording(indices, gap_s=0.6):
    """Held-out sentences one after another with a noisy pause between them, and their joined truth."""
    gap = np.random.default_rng(0).normal(0, 0.002, int(gap_s * 16000)).astype("float32")
    parts = []
    for i in indices:
        parts += [clip(i), gap]
    return np.concatenate(parts[:-1]), " ".join(ROWS[i]["text"] for i in indices)


@pytest.fixture(scope="module")
def pipes():
    return {mode: load_plugin("ctc_draft", model="asr-tiny", mode=mode) for mode in ("strict", "relaxed")} | \
        {"ar": load_plugin("ar", model="asr-tiny")}


def test_held_out_clips_stay_whole():
    assert all(len(split_utterances(torch.from_numpy(clip(i)), 16000, 8.0, 0.4)) == 1 for i in range(0, 200, 5))


def test_two_sentences_and_thirty_seconds_are_transcribed_completely(pipes):
    two, two_truth = recording([0, 1])
    long, long_truth = recording(range(2, 14))
    assert len(long) / 16000 > 30
    texts = {}
    for name, pipe in pipes.items():
        out = pipe([(two, 16000), (long, 16000)])
        assert out.segments[0] == 2 and out.segments[1] >= 10 and out.warnings == [[], []]
        texts[name] = out.texts
        unsplit = pipe([(two, 16000)], segment=False).texts[0]  # the old behaviour: one sentence's worth
        assert jiwer.wer(two_truth, unsplit) > jiwer.wer(two_truth, out.texts[0])
    assert texts["strict"] == texts["ar"]  # lossless on long-form input too
    for name, (two_text, long_text) in texts.items():
        assert jiwer.wer(two_truth, two_text) < 0.35, (name, two_text)
        assert jiwer.wer(long_truth, long_text) < 0.35, (name, long_text)


def test_silence_tiny_clips_and_cut_transcripts_are_reported(pipes):
    pipe = pipes["ar"]
    with pytest.warns(UserWarning, match="audio\\[0\\]: no speech found"):
        out = pipe([(np.zeros(32000, dtype="float32"), 16000), (np.zeros(400, dtype="float32"), 16000),
                    (clip(0), 16000)], max_new_tokens=3)
    assert out.texts[:2] == ["", ""] and out.segments == [0, 0, 1]
    assert "too short to hold a word" in out.warnings[1][0]
    assert out.warnings[2] == ["reached max_new_tokens=3 before the end of an utterance: its text is cut "
                               "(raise max_new_tokens)"]


@pytest.mark.parametrize("max_batch_size", [None, 2])
def test_a_long_recording_is_handed_on_once_all_its_utterances_are_done(pipes, max_batch_size):
    """`on_sample_done` (what `mmspec batch` writes from): an input of several utterances is handed on once, with
    the same text the call returns and the forwards of all its rows; a silent input too, with none."""
    two, _ = recording([0, 1])
    handed = []
    pipe = pipes["strict"]
    out = pipe([(two, 16000), (clip(2), 16000), (np.zeros(32000, dtype="float32"), 16000)], batch_size=2,
               max_batch_size=max_batch_size, on_sample_done=lambda *a: handed.append(a))
    assert out.segments == [2, 1, 0]
    assert sorted(i for i, _, _ in handed) == [0, 1, 2]
    for i, text, statistics in handed:
        assert text == out.texts[i]
    counts = {i: s["target_forwards"] for i, _, s in handed}
    assert counts[2] == 0 and counts[0] > counts[1] > 0  # two utterances' forwards against one's
    assert handed[-1][0] == 2  # no rows to finish: handed on when the call ends
