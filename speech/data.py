"""Offline speech data: fortune sentences spoken by espeak-ng, resampled to 16 kHz, lightly augmented.

espeak-ng is libespeak-ng from the ``espeakng-loader`` wheel (library and voice data, no apt package),
driven through ctypes; only data generation needs it (``pip install 'mmspec[speech-data]'``). The held-out
test set is committed under ``speech/bundled/asr_test`` so tests and benchmarks read Ogg files instead.
The bundled model was trained on audio from the espeak-ng 1.51 command line (Debian bookworm). The wheel
ships 1.52 and seeds the breath noise of breathy variants, so regenerated audio is close to, not identical
with, that data: most committed test utterances re-render to within Vorbis precision, a few differ.
"""

from __future__ import annotations

import _ctypes
import ctypes
import json
import os
import random
from dataclasses import dataclass

import numpy as np
import soundfile
import torch
import torchaudio

from .text import closed_vocabulary_sentences, fortune_sentences, split_sentences  # noqa: F401

SAMPLE_RATE = 16_000

# Base voices × variants used for training and the test set. The klatt and novelty variants (whisper,
# croak, robots) are left out: they make the task harder without making the speculative comparison fairer.
# "en-gb" is no voice file (its voice is "en"): espeak-ng finds it by language and then ignores the variant,
# so every en-gb+… is plain en-gb, as it was with the espeak-ng command line that made the bundled model's data.
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
    def draw(cls, rng: random.Random, mix: "VoiceMix | None" = None) -> "Rendition":
        mix = mix or TRAINING_VOICES
        if mix.piper_share and rng.random() < mix.piper_share:
            voice = PIPER_VOICE  # Piper has no pitch setting; its rate comes from words_per_minute
        else:
            variant = rng.choice(mix.variants)
            voice = rng.choice(mix.base_voices) + (f"+{variant}" if variant else "")
        reverb = rng.uniform(0.1, 0.35) if rng.random() < 0.3 else 0.0
        return cls(voice, rng.randint(135, 185), rng.randint(30, 70), rng.uniform(-6.0, 3.0),
                   rng.uniform(18.0, 40.0), reverb)


PIPER_VOICE = "piper:en_US-joe-medium"


@dataclass(frozen=True)
class VoiceMix:
    """Which voices a corpus is spoken with: espeak-ng base voices × variants, and the share of utterances
    spoken by the Piper voice instead (a neural voice, ``pip install 'mmspec[tts-data]'``)."""

    base_voices: tuple[str, ...]
    variants: tuple[str, ...]
    piper_share: float = 0.0


TRAINING_VOICES = VoiceMix(BASE_VOICES, VOICE_VARIANTS)
# The out-of-domain test set's voices: accents (Scottish, Lancastrian, West Midlands) and variants that no
# training utterance uses.
OUT_OF_DOMAIN_VOICES = VoiceMix(("en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-gbcwmd"),
                                ("", "f4", "m6", "m7", "m8", "adam", "david", "linda"))


def synthesize(text: str, rendition: Rendition, rng: np.random.Generator) -> np.ndarray:
    """Speak ``text`` as ``rendition`` says (espeak-ng, or Piper) and degrade it; float32 mono at 16 kHz."""
    if rendition.voice == PIPER_VOICE:
        wave = _piper()(text, length_scale=160 / rendition.words_per_minute)
    else:
        # A child generator seeds the breath noise, so rng's own draws (reverb, noise) are those of the
        # command-line days and a regenerated test set lines up with the committed one.
        breath_seed = int(rng.spawn(1)[0].integers(2 ** 31))
        audio, rate = espeak(text, rendition.voice, rendition.words_per_minute, rendition.pitch, seed=breath_seed)
        wave = torchaudio.functional.resample(torch.from_numpy(audio), rate, SAMPLE_RATE).numpy()
    return degrade(wave, rendition, rng)


def degrade(wave: np.ndarray, rendition: Rendition, rng: np.random.Generator) -> np.ndarray:
    """Room reverb (if any), gain, then white noise at the rendition's SNR."""
    if rendition.reverb_seconds > 0:
        wave = _reverberate(wave, rendition.reverb_seconds, rng)
    wave = wave / (np.abs(wave).max() + 1e-6) * 0.5 * 10 ** (rendition.gain_db / 20)
    noise = rng.standard_normal(len(wave)).astype(np.float32)
    signal_power = float(np.mean(wave ** 2)) + 1e-12
    wave = wave + noise * np.sqrt(signal_power / 10 ** (rendition.snr_db / 10))
    return wave.astype(np.float32)


_PIPER_SPEAKER = None


def _piper():
    """One Piper voice per process (loading it takes a second)."""
    global _PIPER_SPEAKER
    if _PIPER_SPEAKER is None:
        from .tts_data import PiperSpeaker

        _PIPER_SPEAKER = PiperSpeaker()
    return _PIPER_SPEAKER


# ------------------------------------------------------------------------------ libespeak-ng through ctypes
# Constants of speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2  # espeak_Synth returns once every sample went through the callback
_INITIALIZE_DONT_EXIT = 0x8000  # report a data error instead of calling exit()
_POS_CHARACTER = 1
_CHARS_UTF8, _ENDPAUSE = 1, 0x1000  # _ENDPAUSE: the sentence-final pause the command line adds too
_RATE, _PITCH = 1, 3  # espeak_PARAMETER: words per minute; 0-99, 50 normal


class _VOICE(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_char_p), ("identifier", ctypes.c_char_p),
                ("gender", ctypes.c_ubyte), ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte),
                ("xx1", ctypes.c_ubyte), ("score", ctypes.c_int), ("spare", ctypes.c_void_p)]


_SYNTH_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


def _load(library_path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(library_path)  # an absolute path: dlopen searches neither LD_LIBRARY_PATH nor the system
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_SetSynthCallback.argtypes = [_SYNTH_CALLBACK]
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetVoiceByProperties.argtypes = [ctypes.POINTER(_VOICE)]
    lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
    lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                 ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def _espeak_files() -> tuple[str, str]:
    """The espeakng-loader wheel's libespeak-ng and data folder (absolute paths: no system install is used)."""
    try:
        import espeakng_loader
    except ImportError:
        raise RuntimeError("espeakng-loader is not installed (pip install 'mmspec[speech-data]'); "
                           "only data generation needs it") from None
    return espeakng_loader.get_library_path(), espeakng_loader.get_data_path()


def espeak(text: str, voice: str, words_per_minute: int, pitch: int, seed: int) -> tuple[np.ndarray, int]:
    """``text`` as float32 mono at espeak-ng's own rate, like ``espeak-ng -v voice -s wpm -p pitch``.

    Each call loads the library afresh and unloads it after: libespeak-ng keeps wave phase, pitch and echo
    state from one utterance to the next (speaking a sentence twice gives two different waves), and what a
    render_corpus worker happened to speak before must not change an utterance. A reload costs about a
    millisecond. ``seed`` drives the breath noise of the breathy variants (f2, f3, f5).
    """
    library_path, data_path = _espeak_files()
    variant = voice.partition("+")[2]
    if variant and not os.path.isfile(os.path.join(data_path, "voices", "!v", variant)):
        raise ValueError(f"espeak-ng has no voice variant {variant!r}")  # espeak-ng would ignore it silently
    lib = _load(library_path)
    rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_path.encode(), _INITIALIZE_DONT_EXIT)
    try:
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed ({rate}) with {library_path}")
        chunks = []

        def collect(wav, num_samples, events) -> int:
            if num_samples > 0:
                chunks.append(ctypes.string_at(wav, num_samples * 2))
            return 0  # continue

        callback = _SYNTH_CALLBACK(collect)  # referenced until synthesis is over: the library keeps the pointer
        lib.espeak_SetSynthCallback(callback)
        # As the command line: a voice file name ("en-us"), else a language ("en-gb" lives in the file "en");
        # the voice first, then the parameters.
        if (lib.espeak_SetVoiceByName(voice.encode()) != 0
                and lib.espeak_SetVoiceByProperties(ctypes.byref(_VOICE(languages=voice.encode()))) != 0):
            raise ValueError(f"espeak-ng has no voice {voice!r}")
        for parameter, value in ((_RATE, words_per_minute), (_PITCH, pitch)):
            if lib.espeak_SetParameter(parameter, value, 0) != 0:
                raise RuntimeError(f"espeak_SetParameter({parameter}, {value}) failed")
        lib.espeak_ng_SetRandSeed(seed)  # else seeded from the clock in espeak_Initialize
        data = text.encode("utf-8")
        status = lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8 | _ENDPAUSE, None, None)
        if status != 0:
            raise RuntimeError(f"espeak_Synth failed ({status}) on {text!r}")
    finally:
        if rate > 0:
            lib.espeak_Terminate()  # frees the phoneme data and dictionary dlclose would leak
        _ctypes.dlclose(lib._handle)
    pcm = np.frombuffer(b"".join(chunks), dtype=np.int16)
    return pcm.astype(np.float32) / 32768, rate


def _reverberate(wave: np.ndarray, rt60: float, rng: np.random.Generator) -> np.ndarray:
    """Convolve with a synthetic room response: a direct path plus exponentially decaying noise (60 dB at rt60)."""
    length = int(rt60 * SAMPLE_RATE)
    t = np.arange(length) / SAMPLE_RATE
    response = rng.standard_normal(length) * np.exp(-6.9 * t / rt60) * 0.3
    response[0] = 1.0
    out = torchaudio.functional.fftconvolve(torch.from_numpy(wave), torch.from_numpy(response.astype(np.float32)))
    return out[: len(wave)].numpy()


def _render_one(job: tuple[int, str, int, VoiceMix | None]) -> tuple[int, str, np.ndarray, dict]:
    index, text, seed, mix = job
    rng = random.Random(seed)
    rendition = Rendition.draw(rng, mix)
    wave = synthesize(text, rendition, np.random.default_rng(seed))
    return index, text, wave, rendition.__dict__


def render_corpus(sentences: list[str], renditions_per_sentence: int, seed: int, processes: int = 2,
                  voices: VoiceMix | None = None):
    """Yield ``(index, text, wave, rendition)`` for every sentence × rendition, in index order per chunk."""
    jobs = [(i * renditions_per_sentence + r, s, seed * 1_000_003 + i * renditions_per_sentence + r, voices)
            for i, s in enumerate(sentences) for r in range(renditions_per_sentence)]
    if processes <= 1:
        yield from map(_render_one, jobs)
        return
    import multiprocessing as mp
    # spawn, not fork: a forked child of a process that already ran torch's thread pool can deadlock.
    with mp.get_context("spawn").Pool(processes, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        yield from pool.imap(_render_one, jobs, chunksize=16)


def render_features(sentences: list[str], renditions_per_sentence: int, seed: int, processes: int = 2,
                    voices: VoiceMix | None = None, log=print) -> dict:
    """Speak a corpus and keep only its log-mel features (unnormalised, fp16), so training needs no audio:
    ``{"feats": [frames, n_mels], "offsets": [N+1], "texts": [N]}`` (utterance i is feats[offsets[i]:offsets[i+1]])."""
    import time

    from .asr_model import LogMel

    logmel = LogMel()
    feats, offsets, texts, start = [], [0], [], time.time()
    for index, text, wave, _ in render_corpus(sentences, renditions_per_sentence, seed, processes, voices):
        f = logmel(torch.from_numpy(wave)[None])[0].to(torch.float16)
        feats.append(f)
        offsets.append(offsets[-1] + f.shape[0])
        texts.append(text)
        if (index + 1) % 2000 == 0:
            log(f"{index + 1} utterances, {offsets[-1] / 360000:.1f} h, {time.time() - start:.0f} s")
    return {"feats": torch.cat(feats), "offsets": torch.tensor(offsets), "texts": texts}


def save_features(data: dict, out_dir: str, started: float) -> str:
    """Write ``render_features``' output to ``out_dir/train.pt`` (creating ``out_dir``) and print
    ``wrote N utterances (H h) in S s``, S counted from ``started`` (a ``time.time()`` taken before rendering).
    Returns the path written."""
    import time

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "train.pt")
    torch.save(data, path)
    texts, offsets = data["texts"], data["offsets"]
    # 360 000 frames of 10 ms make an hour.
    print(f"wrote {len(texts)} utterances ({offsets[-1] / 360000:.1f} h) in {time.time() - started:.0f} s")
    return path


def write_test_set(directory: str, sentences: list[str], seed: int = 1, voices: VoiceMix | None = None,
                   sources: list[str] | None = None) -> None:
    """Write one rendition per test sentence as 16 kHz Ogg Vorbis plus ``transcripts.jsonl`` (with each
    sentence's source when ``sources`` is given)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "transcripts.jsonl"), "w") as f:
        for index, text, wave, rendition in render_corpus(sentences, 1, seed, voices=voices):
            name = f"{index:04d}.ogg"
            soundfile.write(os.path.join(directory, name), wave, SAMPLE_RATE, format="OGG", subtype="VORBIS")
            row = {"audio": name, "text": text, "rendition": rendition}
            if sources is not None:
                row["source"] = sources[index]
            f.write(json.dumps(row) + "\n")


def load_test_set(directory: str | None = None) -> list[dict]:
    """The committed held-out set: a list of ``{"audio": path, "text": transcript}``."""
    directory = directory or os.path.join(os.path.dirname(__file__), "bundled", "asr_test")
    with open(os.path.join(directory, "transcripts.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{"audio": os.path.join(directory, r["audio"]), "text": r["text"]} for r in rows]


# ------------------------------------------------------------------------------ bench test sets
_BUNDLED = os.path.join(os.path.dirname(__file__), "bundled")
BENCH_TEST_SETS = {
    "in_domain": "fortunes sentences held out of training, espeak-ng training voices (speech/bundled/asr_test)",
    "out_of_domain": "README sentences of installed packages (a text source training never saw) in espeak-ng "
                     "accents and variants training never used (speech/bundled/asr_ood)",
    "foreign": "German dates in espeak-ng's German voices: a language the model was not trained on "
               "(speech/bundled/asr_foreign)",
    "noise": "white, brown and mains-hum noise, 2-6 s, no speech (generated, seeded)",
}


def noise_clips(count: int = 120, seed: int = 0) -> list[dict]:
    """Clips with no speech (reference text ""): white, brown (integrated white) and 50 Hz hum with
    harmonics under white noise, 2-6 s each, at speech-like levels; a pure function of (count, seed)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        n = int(rng.uniform(2.0, 6.0) * SAMPLE_RATE)
        white = rng.standard_normal(n).astype(np.float32)
        kind = ("white", "brown", "hum")[i % 3]
        if kind == "brown":
            wave = np.cumsum(white)
            wave -= np.convolve(wave, np.ones(801) / 801, mode="same")  # keep it from drifting off
        elif kind == "hum":
            t = np.arange(n) / SAMPLE_RATE
            wave = sum(np.sin(2 * np.pi * 50 * k * t + rng.uniform(0, 6.3)) / k for k in (1, 2, 3, 5)) + 0.1 * white
        else:
            wave = white
        wave = (wave / (np.abs(wave).max() + 1e-6) * rng.uniform(0.05, 0.5)).astype(np.float32)
        rows.append({"audio": {"array": wave, "sampling_rate": SAMPLE_RATE}, "text": "", "kind": kind})
    return rows


def bench_test_set(name: str) -> list[dict]:
    """The rows of one of BENCH_TEST_SETS: ``{"audio": path or array dict, "text": transcript}``."""
    if name not in BENCH_TEST_SETS:
        raise ValueError(f"test_set must be one of {sorted(BENCH_TEST_SETS)}, got {name!r}")
    if name == "noise":
        return noise_clips()
    folder = {"in_domain": "asr_test", "out_of_domain": "asr_ood", "foreign": "asr_foreign"}[name]
    return load_test_set(os.path.join(_BUNDLED, folder))
