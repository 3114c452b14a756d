"""Synthesize the ASR training features and the committed held-out test set with espeak-ng.

    pip install -e '.[speech-data]'                    # espeak-ng from the espeakng-loader wheel
    python examples/make_asr_data.py                   # runs/asr_data/train.pt + speech/bundled/asr_test

Sentences: the committed Debian fortunes list (speech/bundled/sentences/fortunes.txt) restricted to the
3 000 most frequent words (a closed-vocabulary task, see `speech.data.closed_vocabulary_sentences`), split
by sentence. Each training sentence is spoken `--renditions` times with random voice, speed, pitch, gain,
noise and reverb; features are log-mel (unnormalised, fp16) so training needs no audio. The test set is one rendition per held-out sentence,
written as 16 kHz Ogg Vorbis to keep the repository small.
"""

from __future__ import annotations

import argparse
import os
import time

from mmspec.speech.data import (closed_vocabulary_sentences, render_features, save_features, split_sentences,
                                write_test_set)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/asr_data")
    parser.add_argument("--test-dir", default=os.path.join(os.path.dirname(__file__), "..", "speech", "bundled",
                                                            "asr_test"))
    parser.add_argument("--vocabulary", type=int, default=3000, help="keep sentences made of this many top words")
    parser.add_argument("--num-test", type=int, default=200)
    parser.add_argument("--renditions", type=int, default=4)
    parser.add_argument("--limit", type=int, default=None, help="use only this many training sentences (smoke)")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)

    sentences = closed_vocabulary_sentences(args.vocabulary)
    train, test = split_sentences(sentences, args.num_test)
    if args.limit is not None:
        train = train[: args.limit]
    print(f"{len(sentences)} sentences: {len(train)} train, {len(test)} test")
    if args.test_dir:
        write_test_set(args.test_dir, test)

    start = time.time()
    data = render_features(train, args.renditions, seed=0, processes=args.processes,
                           log=lambda m: print(m, flush=True))
    save_features(data, args.out, started=start)


if __name__ == "__main__":
    main()
