"""Speech data generation with pip packages only: espeak-ng synthesis through the espeakng-loader wheel, and the
committed sentence list is the one the bundled model was trained on."""

import itertools

import numpy as np
import pytest

from mmspec.speech.data import (BASE_VOICES, SAMPLE_RATE, VOICE_VARIANTS, Rendition, closed_vocabulary_sentences,
                                espeak, load_test_set, split_sentences, synthesize)
from mmspec.speech.text import fortune_sentences

TEXT = "the cat sat on the mat"


def rendition(voice="en-us", **changes):
    return Rendition(**{"voice": voice, "words_per_minute": 160, "pitch": 50, "gain_db": 0.0, "snr_db": 30.0,
                        "reverb_seconds": 0.2, **changes})


def test_synthesis_is_16khz_float32_mono_and_repeatable():
    wave = synthesize(TEXT, rendition(), np.random.default_rng(0))
    assert wave.dtype == np.float32 and wave.ndim == 1 and np.isfinite(wave).all()
    assert 0.8 < len(wave) / SAMPLE_RATE < 4.0  # six words at 160 words per minute, plus the final pause
    raw, rate = espeak(TEXT, "en-us", 160, 50, seed=0)
    assert rate == 22050 and abs(len(wave) - len(raw) * SAMPLE_RATE / rate) <= 1  # resampled to 16 kHz
    np.testing.assert_array_equal(wave, synthesize(TEXT, rendition(), np.random.default_rng(0)))
    assert not np.array_equal(wave, synthesize(TEXT, rendition(), np.random.default_rng(1)))


def test_every_voice_exists_and_sounds_different():
    # espeak-ng falls back to another voice or ignores a missing variant silently: distinct waves show it did not.
    waves = {}
    for base, variant in itertools.product(BASE_VOICES, VOICE_VARIANTS):
        voice = base + (f"+{variant}" if variant else "")
        waves[voice] = espeak(TEXT, voice, 160, 50, seed=0)[0]
    en_gb = [v for v in waves if v.startswith("en-gb+")]
    assert all(np.array_equal(waves[v], waves["en-gb"]) for v in en_gb)  # found by language: variant ignored
    distinct = [v for v in waves if v not in en_gb]
    assert len(distinct) == 41
    for a, b in itertools.combinations(distinct, 2):
        assert not np.array_equal(waves[a], waves[b]), (a, b)
    with pytest.raises(ValueError, match="variant"):
        espeak(TEXT, "en-us+nonexistent", 160, 50, seed=0)


def test_an_utterance_does_not_depend_on_what_was_spoken_before():
    # libespeak-ng keeps wave state between utterances; espeak() reloads it so render_corpus workers agree.
    first = espeak(TEXT, "en-us+f3", 150, 40, seed=5)[0]  # f3 is breathy: the seed drives its noise
    espeak("something else entirely", "en-029+m2", 180, 60, seed=9)
    np.testing.assert_array_equal(first, espeak(TEXT, "en-us+f3", 150, 40, seed=5)[0])
    assert not np.array_equal(first, espeak(TEXT, "en-us+f3", 150, 40, seed=6)[0])


def test_committed_sentences_give_the_committed_test_set():
    sentences = fortune_sentences()
    assert len(sentences) == len(set(sentences)) == 18227
    train, test = split_sentences(closed_vocabulary_sentences(), 200)
    committed = sorted(row["text"] for row in load_test_set())
    assert len(train) == 5667 and test == committed  # the split the bundled model was trained and tested on
