"""TTS data from pip alone: the Piper voice wheel speaks the sentences, deterministically and resumably."""

import os

import numpy as np
import soundfile

from mmspec.speech.tts_data import (MAX_CHARACTERS, SAMPLE_RATE, PiperSpeaker, length_scale_for, load_shards,
                                    load_tts_test_set, render_shards, tts_sentences)


def test_piper_speaks_deterministically_at_16_khz():
    speaker = PiperSpeaker()
    a, b = speaker("the sun reads a scroll"), speaker("the sun reads a scroll")
    assert a.dtype == np.float32 and 0.8 * SAMPLE_RATE < len(a) < 4 * SAMPLE_RATE
    np.testing.assert_array_equal(a, b)
    slower = speaker("the sun reads a scroll", length_scale=1.08)
    assert len(slower) > len(a)


def test_shards_are_resumable_and_regenerate_identically(tmp_path):
    sentences = ["he hits the board", "the sun swings", "a fool and his money"]
    paths = render_shards(str(tmp_path), sentences, shard_size=2, seed=3, log=lambda _: None)
    assert [os.path.basename(p) for p in paths] == ["shard_0000.npz", "shard_0001.npz"]
    waves, texts = load_shards(paths)
    assert texts == sentences and all(w.dtype == np.int16 and len(w) > SAMPLE_RATE // 2 for w in waves)
    first_mtime = os.path.getmtime(paths[0])
    os.remove(paths[1])
    render_shards(str(tmp_path), sentences, shard_size=2, seed=3, log=lambda _: None)
    assert os.path.getmtime(paths[0]) == first_mtime  # kept, not redone
    again, _ = load_shards(paths)
    np.testing.assert_array_equal(again[2], waves[2])
    assert length_scale_for(2, 3) == length_scale_for(2, 3) != length_scale_for(2, 4)


def test_sentence_split_is_by_sentence_and_the_held_out_set_is_committed():
    train, test = tts_sentences(40)
    assert len(test) == 40 and not set(train) & set(test)
    assert max(map(len, train + test)) <= MAX_CHARACTERS
    rows = load_tts_test_set()
    assert [r["text"] for r in rows] == test
    info = soundfile.info(rows[0]["audio"])
    assert info.samplerate == SAMPLE_RATE and info.channels == 1
    # The committed clip is what the data script renders (up to Vorbis coding).
    committed = soundfile.read(rows[0]["audio"], dtype="float32")[0]
    fresh = PiperSpeaker()(rows[0]["text"], length_scale_for(0, 1))
    n = min(len(committed), len(fresh))
    assert abs(len(committed) - len(fresh)) < 0.01 * SAMPLE_RATE
    assert np.corrcoef(committed[:n], fresh[:n])[0, 1] > 0.95
