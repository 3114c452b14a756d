"""Judge a codec by resynthesis of the committed held-out recordings: Whisper tiny.en and asr-tiny word error on
the original audio (the floor) and on the codec's encode -> decode, and the MCD between the two.

    python examples/eval_codec.py                                  # the bundled codec
    python examples/eval_codec.py --codec runs/codec/checkpoint.pt --write-wavs docs/audio

Numbers go to stdout as JSON (and `--json`), with the sample count.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import soundfile
import torch

from mmspec.speech.codec import SpectralRVQCodec
from mmspec.speech.judge import tts_quality
from mmspec.speech.tts_data import load_tts_test_set
from mmspec.speech.tts_pipeline import BUNDLED_TTS_DIR


def load_codec(path: str) -> SpectralRVQCodec:
    if path.endswith(".pt"):  # a training checkpoint
        codec = SpectralRVQCodec()
        codec.load_state_dict(torch.load(path, weights_only=False)["model"])
        return codec.eval()
    return SpectralRVQCodec.from_pretrained(path, torch_dtype=torch.float32).eval()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--codec", default=str(BUNDLED_TTS_DIR / "codec"))
    parser.add_argument("--num", type=int, default=40, help="held-out recordings to judge")
    parser.add_argument("--write-wavs", default=None, help="folder for the first two resyntheses (listening)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    codec = load_codec(args.codec)
    rows = load_tts_test_set()[: args.num]
    texts = [row["text"] for row in rows]
    originals = [soundfile.read(row["audio"], dtype="float32")[0] for row in rows]
    resynthesized = []
    for wave in originals:
        codes, frames = codec.encode(torch.from_numpy(wave)[None])
        audio, _ = codec.decode(codes, frames)
        resynthesized.append(audio[0, : len(wave)].numpy())
    judges = ("whisper", "asr-tiny")
    result = {"codec": args.codec, "num_samples": len(rows),
              "original": tts_quality(texts, originals, codec.sampling_rate, judges=judges),
              "resynthesized": tts_quality(texts, resynthesized, codec.sampling_rate, references=originals,
                                           judges=judges)}
    if args.write_wavs:
        os.makedirs(args.write_wavs, exist_ok=True)
        for i in range(2):
            soundfile.write(os.path.join(args.write_wavs, f"codec_original_{i}.wav"), originals[i], 16000)
            soundfile.write(os.path.join(args.write_wavs, f"codec_resynthesis_{i}.wav"),
                            np.clip(resynthesized[i], -1, 1), 16000)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
