"""Offline speech data: fortune sentences spoken by espeak-ng, resampled to 16 kHz, lightly augmented.

Only data generation needs espeak-ng (``apt-get install espeak-ng``); the held-out test set is committed
under ``speech/bundled/asr_test`` so tests and benchmarks read Ogg files instead.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass

import numpy as np
import soundfile
import torch
import torchaudio

from .text import fortune_sentences

SAMPLE_RATE = 16_000

# Base voices × variants used for training and the test set. The klatt and novelty variants (whisper,
# croak, robots) are left out: they make the task harder without making the speculative comparison fairer.
BASE_VOICES = ("en-us", "en-gb", "en-gb-x-rp", "en-029", "en-us-nyc")
VOICE_VARIANTS = ("", "f1", "f2", "f3", "f5", "m1", "m2", "m3", "m4", "m5")


@dataclass(frozen=True)
class Rendition:
    """How one utterance is spoken and degraded; drawn from a seeded RNG so data generation is repeatable."""

    voice: str
    words_per_minute: int
    pitch: int
    gain_db: float
    snr_db: float
    reverb_seconds: float  # 0: dry

    @classmethod
    def draw(cls, rng: random.Random) -> "Rendition":
        variant = rng.choice(VOICE_VARIANTS)
        voice = rng.choice(BASE_VOICES) + (f"+{variant}" if variant else "")
        reverb = rng.uniform(0.1, 0.35) if rng.random() < 0.3 else 0.0
        return cls(voice, rng.randint(135, 185), rng.randint(30, 70), rng.uniform(-6.0, 3.0),
                   rng.uniform(18.0, 40.0), reverb)


def closed_vocabulary_sentences(num_words: int = 3000) -> list[str]:
    """Fortune sentences whose every word is among the corpus's ``num_words`` most frequent words.

    The bundled model is a closed-vocabulary recogniser: with a few thousand sentences and CPU-hours of
    training, spelling arbitrary words back from espeak's pronunciation is what keeps word error high (see
    asr_feasibility.md), and the speculative comparison needs a model whose AR output is mostly right.
    """
    sentences = fortune_sentences()
    counts = Counter(w for s in sentences for w in s.split())
    vocabulary = {w for w, _ in counts.most_common(num_words)}
    return [s for s in sentences if all(w in vocabulary for w in s.split())]


def split_sentences(sentences: list[str], num_test: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Deterministic train/test split by sentence (a sentence never appears in both)."""
    order = list(range(len(sentences)))
    random.Random(seed).shuffle(order)
    test = sorted(sentences[i] for i in order[:num_test])
    train = sorted(sentences[i] for i in order[num_test:])
    return train, test


def synthesize(text: str, rendition: Rendition, rng: np.random.Generator) -> np.ndarray:
    """Speak ``text`` with espeak-ng and degrade it as ``rendition`` says; float32 mono at 16 kHz."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed (apt-get install espeak-ng); only data generation needs it")
    wav_bytes = subprocess.run(
        ["espeak-ng", "--stdout", "-v", rendition.voice, "-s", str(rendition.words_per_minute),
         "-p", str(rendition.pitch), text], check=True, capture_output=True).stdout
    audio, rate = soundfile.read(io.BytesIO(wav_bytes), dtype="float32")
    wave = torchaudio.functional.resample(torch.from_numpy(audio), rate, SAMPLE_RATE).numpy()
    if rendition.reverb_seconds > 0:
        wave = _reverberate(wave, rendition.reverb_seconds, rng)
    wave = wave / (np.abs(wave).max() + 1e-6) * 0.5 * 10 ** (rendition.gain_db / 20)
    noise = rng.standard_normal(len(wave)).astype(np.float32)
    signal_power = float(np.mean(wave ** 2)) + 1e-12
    wave = wave + noise * np.sqrt(signal_power / 10 ** (rendition.snr_db / 10))
    return wave.astype(np.float32)


def _reverberate(wave: np.ndarray, rt60: float, rng: np.random.Generator) -> np.ndarray:
    """Convolve with a synthetic room response: a direct path plus exponentially decaying noise (60 dB at rt60)."""
    length = int(rt60 * SAMPLE_RATE)
    t = np.arange(length) / SAMPLE_RATE
    response = rng.standard_normal(length) * np.exp(-6.9 * t / rt60) * 0.3
    response[0] = 1.0
    out = torchaudio.functional.fftconvolve(torch.from_numpy(wave), torch.from_numpy(response.astype(np.float32)))
    return out[: len(wave)].numpy()


def _render_one(job: tuple[int, str, int]) -> tuple[int, str, np.ndarray, dict]:
    index, text, seed = job
    rng = random.Random(seed)
    rendition = Rendition.draw(rng)
    wave = synthesize(text, rendition, np.random.default_rng(seed))
    return index, text, wave, rendition.__dict__


def render_corpus(sentences: list[str], renditions_per_sentence: int, seed: int, processes: int = 2):
    """Yield ``(index, text, wave, rendition)`` for every sentence × rendition, in index order per chunk."""
    jobs = [(i * renditions_per_sentence + r, s, seed * 1_000_003 + i * renditions_per_sentence + r)
            for i, s in enumerate(sentences) for r in range(renditions_per_sentence)]
    if processes <= 1:
        yield from map(_render_one, jobs)
        return
    import multiprocessing as mp
    # spawn, not fork: a forked child of a process that already ran torch's thread pool can deadlock.
    with mp.get_context("spawn").Pool(processes, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        yield from pool.imap(_render_one, jobs, chunksize=16)


def write_test_set(directory: str, sentences: list[str], seed: int = 1) -> None:
    """Write one rendition per test sentence as 16 kHz Ogg Vorbis plus ``transcripts.jsonl``."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "transcripts.jsonl"), "w") as f:
        for index, text, wave, rendition in render_corpus(sentences, 1, seed):
            name = f"{index:04d}.ogg"
            soundfile.write(os.path.join(directory, name), wave, SAMPLE_RATE, format="OGG", subtype="VORBIS")
            f.write(json.dumps({"audio": name, "text": text, "rendition": rendition}) + "\n")


def load_test_set(directory: str | None = None) -> list[dict]:
    """The committed held-out set: a list of ``{"audio": path, "text": transcript}``."""
    directory = directory or os.path.join(os.path.dirname(__file__), "bundled", "asr_test")
    with open(os.path.join(directory, "transcripts.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{"audio": os.path.join(directory, r["audio"]), "text": r["text"]} for r in rows]
