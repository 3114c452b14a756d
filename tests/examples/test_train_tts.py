"""Smoke tests of the TTS data, codec and TTS training scripts: Piper speaks a few sentences (pip wheels only),
each trainer runs a few steps, an interrupted run resumes to the same weights, and the result loads as a
TTSPipeline that speaks."""

import json

import pytest
import torch

from mmspec.speech.codec import SpectralRVQCodec
from mmspec.speech.tts_data import load_tts_test_set
from mmspec.speech.tts_pipeline import TTSPipeline

from run_example import run_example

pytestmark = pytest.mark.train

TINY_CODEC = json.dumps(dict(dim=32, ffn=64, fine_dim=16, encoder_blocks=1, decoder_blocks=1, fine_blocks=1,
                             codebook_size=32))
TINY_TTS = json.dumps(dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, depth_hidden_size=32,
                           depth_layers=1, depth_heads=2, depth_intermediate_size=64))


def same_weights(a, b):
    for (name, x), (_, y) in zip(a.items(), b.items()):
        assert torch.equal(x, y), name


def test_make_data_train_codec_and_tts_resume_and_speak(tmp_path):
    data, test_dir = tmp_path / "data", tmp_path / "test"
    run_example("make_tts_data.py", ["--out", data, "--test-dir", test_dir, "--num-test", 2, "--num-train", 6,
                                     "--shard-size", 3])
    assert sorted(p.name for p in data.iterdir()) == ["shard_0000.npz", "shard_0001.npz"]
    assert len(load_tts_test_set(str(test_dir))) == 2

    codec_args = ["--data", data, "--num-shards", 2, "--config", TINY_CODEC, "--batch-size", 4, "--crop-frames", 8,
                  "--checkpoint-every", 10, "--warmup", 2, "--steps", 4]
    run_example("train_codec.py", codec_args + ["--work-dir", tmp_path / "ca", "--out", tmp_path / "codec_a"])
    run_example("train_codec.py", codec_args + ["--work-dir", tmp_path / "cb", "--out", tmp_path / "codec_b",
                                                "--stop-after", 2])
    assert not (tmp_path / "codec_b").exists()
    run_example("train_codec.py", codec_args + ["--work-dir", tmp_path / "cb", "--out", tmp_path / "codec_b"])
    same_weights(SpectralRVQCodec.from_pretrained(tmp_path / "codec_a").state_dict(),
                 SpectralRVQCodec.from_pretrained(tmp_path / "codec_b").state_dict())

    tts_args = ["--data", data, "--codec", tmp_path / "codec_a", "--config", TINY_TTS, "--batch-positions", 400,
                "--checkpoint-every", 10, "--warmup", 2, "--steps", 4, "--num-validation", 2]
    run_example("train_tts.py", tts_args + ["--work-dir", tmp_path / "ta", "--out", tmp_path / "tts_a"])
    run_example("train_tts.py", tts_args + ["--work-dir", tmp_path / "tb", "--out", tmp_path / "tts_b",
                                            "--stop-after", 2])
    run_example("train_tts.py", tts_args + ["--work-dir", tmp_path / "tb", "--out", tmp_path / "tts_b"])
    a, b = TTSPipeline.from_pretrained(tmp_path / "tts_a"), TTSPipeline.from_pretrained(tmp_path / "tts_b")
    same_weights(a.model.state_dict(), b.model.state_dict())
    a.set_progress_bar_config(disable=True)
    out = a(["the sun swings"], generator=[torch.Generator().manual_seed(0)], max_new_frames=40)
    assert out.codes[0].shape[0] == 8 and out.audios[0].ndim == 1
