"""Judges of synthesized speech on the committed Piper recordings: Whisper tiny.en hears them, MCD orders
distortions (identical < time-stretched < another sentence < noise), and tts_quality checks its inputs."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
import torchaudio

from mmspec.speech.judge import WhisperJudge, dtw_path, mel_cepstral_distortion, tts_quality
from mmspec.speech.metrics import error_rates

TTS_TEST = Path(__file__).resolve().parents[2] / "speech" / "bundled" / "tts_test"


def clips(count):
    rows = [json.loads(line) for line in (TTS_TEST / "transcripts.jsonl").read_text().splitlines()[:count]]
    waves = []
    for row in rows:
        wave, rate = soundfile.read(TTS_TEST / row["audio"], dtype="float32")
        assert rate == 16000 and wave.ndim == 1
        waves.append(wave)
    return [r["text"] for r in rows], waves


def test_whisper_judge_hears_held_out_recordings():
    texts, waves = clips(8)
    hypotheses = WhisperJudge().transcribe(waves, 16000)
    assert len(hypotheses) == 8 and all(isinstance(h, str) and h for h in hypotheses)
    assert error_rates(texts, hypotheses)["wer"] < 0.2


def test_whisper_judge_resamples_and_loads_once():
    texts, waves = clips(1)
    at_24k = torchaudio.functional.resample(torch.from_numpy(waves[0]), 16000, 24000).numpy()
    judge = WhisperJudge()
    assert error_rates(texts, judge.transcribe([at_24k], 24000))["wer"] < 0.2
    assert judge.model() is WhisperJudge().model()


def test_whisper_judge_without_faster_whisper_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "faster_whisper", None)  # import then raises ImportError
    with pytest.raises(RuntimeError, match=r"mmspec\[tts-judge\]"):
        WhisperJudge().transcribe([np.zeros(16000, np.float32)], 16000)


def test_dtw_path_is_the_cheapest_monotone_path():
    rng = np.random.default_rng(0)
    for rows, cols in [(1, 1), (1, 7), (6, 1), (9, 13), (20, 11)]:
        cost = rng.random((rows, cols))
        best = np.full((rows + 1, cols + 1), np.inf)
        best[0, 0] = 0.0
        for i in range(rows):
            for j in range(cols):
                best[i + 1, j + 1] = cost[i, j] + min(best[i, j], best[i, j + 1], best[i + 1, j])
        path = dtw_path(cost)
        assert path[0] == (0, 0) and path[-1] == (rows - 1, cols - 1)
        assert all((b[0] - a[0], b[1] - a[1]) in {(0, 1), (1, 0), (1, 1)} for a, b in zip(path, path[1:]))
        assert sum(cost[i, j] for i, j in path) == pytest.approx(best[rows, cols])


def test_mcd_orders_distortions():
    _, (wave, other) = clips(2)
    slower = torchaudio.functional.resample(torch.from_numpy(wave), 9, 10).numpy()  # 0.9x speed, longer
    noise = np.random.default_rng(0).standard_normal(len(wave)).astype(np.float32) * 0.1
    same = mel_cepstral_distortion(wave, wave, 16000)
    stretched = mel_cepstral_distortion(wave, slower, 16000)
    different = mel_cepstral_distortion(wave, other, 16000)
    noisy = mel_cepstral_distortion(wave, noise, 16000)
    assert same == pytest.approx(0.0, abs=1e-6)
    assert 0 < stretched < 0.7 * different
    assert noisy > max(different, 2 * stretched)
    assert mel_cepstral_distortion(slower, wave, 16000) == pytest.approx(stretched, rel=0.05)  # DTW is symmetric
    with pytest.raises(ValueError, match="num_coefficients"):
        mel_cepstral_distortion(wave, wave, 16000, num_coefficients=80)
    with pytest.raises(ValueError, match="synthesized"):
        mel_cepstral_distortion(wave, np.zeros(0, np.float32), 16000)


def test_tts_quality_keys_and_input_checks():
    texts, waves = clips(2)
    result = tts_quality(texts, waves, 16000, references=waves[::-1], judges=("whisper", "asr-tiny"))
    per_sample = result.pop("per_sample")
    assert set(result) == {"whisper_wer", "whisper_cer", "asr_tiny_wer", "asr_tiny_cer", "mcd_db", "num_samples"}
    assert set(per_sample) == set(result) - {"num_samples"}
    for key, (numerators, denominators) in per_sample.items():  # the parts add up to each figure
        assert len(numerators) == len(denominators) == 2
        assert sum(numerators) / sum(denominators) == pytest.approx(result[key])
    assert result["num_samples"] == 2 and result["whisper_wer"] < 0.2 and result["mcd_db"] > 2  # two different sentences
    assert tts_quality(texts, waves, 16000, references=waves, judges=())["mcd_db"] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="waves"):
        tts_quality(texts, waves[:1], 16000)
    with pytest.raises(ValueError, match="references"):
        tts_quality(texts, waves, 16000, references=waves[:1])
    with pytest.raises(ValueError, match=r"judges.*whisper, asr-tiny"):
        tts_quality(texts, waves, 16000, judges=("whisper-large",))
    with pytest.raises(ValueError, match=r"waves\[1\]: audio is empty"):
        tts_quality(texts, [waves[0], np.zeros(0, np.float32)], 16000, judges=())
