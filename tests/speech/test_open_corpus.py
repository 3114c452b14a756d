"""The open-vocabulary data: spoken-form normalisation, sentence extraction, the committed training list and
the out-of-domain / foreign / noise bench sets (disjoint from training text, voices unseen in training)."""

import numpy as np
import pytest

from mmspec.speech.corpus import prose_sentences, read_sentence_list, spoken_form, split_into_sentences
from mmspec.speech.data import (BASE_VOICES, BENCH_TEST_SETS, OUT_OF_DOMAIN_VOICES, PIPER_VOICE, TRAINING_VOICES,
                                VOICE_VARIANTS, Rendition, VoiceMix, bench_test_set, espeak, load_test_set,
                                noise_clips)


@pytest.mark.parametrize("text, spoken", [
    ("In 1999, Dr. Smith paid $5.50 for 3 apples.",
     "in nineteen ninety nine doctor smith paid five dollars and fifty cents for three apples"),
    ("Sales rose 15% in the 2nd quarter of 2,500 units.",
     "sales rose fifteen percent in the second quarter of two thousand five hundred units"),
    ("Use e.g. version 3.5 & later.", "use for example version three point five and later"),
    ("It's the user's choice.", "it's the user's choice"),
])
def test_spoken_form_says_numbers_symbols_and_abbreviations_as_words(text, spoken):
    assert spoken_form(text) == spoken


@pytest.mark.parametrize("code", ["Call os.path.join here.", "Set max_len to 3.", "See https://x.org now.",
                                  "Returns `None`.", "Use getValue to read it.", "The HTTP API is fast.",
                                  "Schreibt Grüße nach Köln.", "Raises ValueError(msg)."])
def test_spoken_form_drops_code_identifiers_urls_and_other_scripts(code):
    assert spoken_form(code) is None


def test_sentence_split_keeps_abbreviations_and_drops_fragments():
    assert split_into_sentences("Ask Dr. Smith first. Then go home! Why not?") == [
        "Ask Dr. Smith first.", "Then go home!", "Why not?"]
    got = list(prose_sentences(["Installation", "This library parses files quickly. It works.",
                                "Two words.", "A sentence with enough words to keep in the list."]))
    assert got == ["this library parses files quickly", "a sentence with enough words to keep in the list"]


def test_committed_lists_are_disjoint_and_test_voices_are_unseen():
    train = read_sentence_list()
    assert len(train) == len(set(train)) > 40000 and all(s == spoken_form(s) for s in train[::500])
    vocabulary = {w for s in train for w in s.split()}
    assert len(vocabulary) > 15000  # open vocabulary: the closed model knew 3 000 words
    training = set(train)
    in_domain, ood = load_test_set(), bench_test_set("out_of_domain")
    assert len(ood) == 200 and not training & {r["text"] for r in ood} and not training & {r["text"] for r in in_domain}
    ood_words = [w for r in ood for w in r["text"].split()]
    unknown = sum(w not in vocabulary for w in ood_words) / len(ood_words)
    assert unknown < 0.1  # unseen sentences, mostly known words: what a user's speech looks like
    training_voices = {b + (f"+{v}" if v else "") for b in BASE_VOICES for v in VOICE_VARIANTS} | {PIPER_VOICE}
    import json
    import os
    for name in ("asr_ood", "asr_foreign"):
        folder = os.path.join(os.path.dirname(load_test_set()[0]["audio"]), "..", name)
        with open(os.path.join(folder, "transcripts.jsonl")) as f:
            voices = {json.loads(line)["rendition"]["voice"] for line in f}
        assert voices and not voices & training_voices, name
    assert len(bench_test_set("foreign")) == 40


def test_voice_mixes_draw_their_own_voices_and_piper_share():
    import random

    drawn = [Rendition.draw(random.Random(i), OUT_OF_DOMAIN_VOICES).voice for i in range(200)]
    assert all(v.split("+")[0] in OUT_OF_DOMAIN_VOICES.base_voices for v in drawn)
    mix = VoiceMix(BASE_VOICES, VOICE_VARIANTS, piper_share=0.25)
    share = np.mean([Rendition.draw(random.Random(i), mix).voice == PIPER_VOICE for i in range(2000)])
    assert 0.2 < share < 0.3
    # The default mix draws exactly as before (the committed in-domain set stays reproducible).
    assert [Rendition.draw(random.Random(i)) for i in range(20)] == \
        [Rendition.draw(random.Random(i), TRAINING_VOICES) for i in range(20)]
    for base in OUT_OF_DOMAIN_VOICES.base_voices:  # each held-out accent exists and differs from the others
        espeak("a short test", base, 160, 50, seed=0)
    waves = [espeak("a short test", b, 160, 50, seed=0)[0] for b in OUT_OF_DOMAIN_VOICES.base_voices]
    assert not any(np.array_equal(a, b) for i, a in enumerate(waves) for b in waves[i + 1:])


def test_noise_clips_are_seeded_speechless_and_at_speech_levels():
    clips = noise_clips()
    assert len(clips) == 120 and {c["kind"] for c in clips} == {"white", "brown", "hum"}
    for clip in clips:
        wave = clip["audio"]["array"]
        assert clip["text"] == "" and 2.0 <= len(wave) / 16000 <= 6.0 and 0.04 < np.abs(wave).max() <= 0.5
    np.testing.assert_array_equal(clips[4]["audio"]["array"], noise_clips()[4]["audio"]["array"])
    assert set(BENCH_TEST_SETS) == {"in_domain", "out_of_domain", "foreign", "noise"}
    with pytest.raises(ValueError, match="test_set must be one of"):
        bench_test_set("ood")
