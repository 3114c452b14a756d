"""Smoke tests of the ASR data and training scripts: espeak-ng synthesis of a few sentences (the
espeakng-loader wheel, the committed sentence list), a few training steps that resume exactly, and the saved
folder loads as an ASRPipeline."""

from pathlib import Path

import pytest
import torch

from mmspec.speech.data import load_test_set
from mmspec.speech.pipeline import ASRPipeline

from run_example import run_example

pytestmark = pytest.mark.train

TINY = "encoder_dim=32,encoder_layers=1,encoder_heads=2,encoder_ffn=64,decoder_dim=32,decoder_layers=1," \
       "decoder_heads=2,decoder_ffn=64"
run = run_example


def test_make_data_then_train_resume_and_load(tmp_path):
    data, test_dir = tmp_path / "data", tmp_path / "test"
    run("make_asr_data.py", ["--out", data, "--test-dir", test_dir, "--num-test", 2, "--limit", 3,
                             "--renditions", 2, "--processes", 1])
    saved = torch.load(data / "train.pt")
    assert len(saved["texts"]) == 6 and saved["feats"].shape[1] == 80 and saved["offsets"][-1] == len(saved["feats"])
    rows = load_test_set(str(test_dir))
    assert len(rows) == 2 and Path(rows[0]["audio"]).exists()

    common = ["--data", data / "train.pt", "--batch-frames", 2000, "--config", TINY, "--checkpoint-every", 2,
              "--warmup", 2]
    run("train_asr.py", common + ["--work-dir", tmp_path / "a", "--out", tmp_path / "a_out", "--steps", 4])
    run("train_asr.py", common + ["--work-dir", tmp_path / "b", "--out", tmp_path / "b_out", "--steps", 2])
    run("train_asr.py", common + ["--work-dir", tmp_path / "b", "--out", tmp_path / "b_out", "--steps", 4])
    a = ASRPipeline.from_pretrained(tmp_path / "a_out")
    b = ASRPipeline.from_pretrained(tmp_path / "b_out")
    for (name, x), (_, y) in zip(a.recognizer.model.state_dict().items(), b.recognizer.model.state_dict().items()):
        assert torch.equal(x, y), name  # stopping at step 2 and resuming gives the same weights
    assert len(a([r["audio"] for r in rows], max_new_tokens=5).texts) == 2


def test_open_vocabulary_data_and_fine_tuning_resume_exactly(tmp_path):
    """The open-vocabulary pipeline: features of committed training sentences (espeak-ng and Piper voices),
    then fine-tuning a saved model (--init) that stops, resumes and ends with the same weights."""
    data = tmp_path / "open"
    run("make_open_asr_data.py", ["--out", data, "--from-committed", "--limit", 4, "--piper-share", 0.5,
                                  "--processes", 1])
    saved = torch.load(data / "train.pt")
    assert len(saved["texts"]) == 4 and saved["offsets"][-1] == len(saved["feats"])
    run("train_asr.py", ["--data", data / "train.pt", "--config", TINY, "--work-dir", tmp_path / "init",
                         "--out", tmp_path / "init_out", "--steps", 1, "--batch-frames", 2000])
    common = ["--data", data / "train.pt", "--batch-frames", 2000, "--checkpoint-every", 2, "--warmup", 2,
              "--init", tmp_path / "init_out"]
    run("train_asr.py", common + ["--work-dir", tmp_path / "a", "--out", tmp_path / "a_out", "--steps", 4])
    run("train_asr.py", common + ["--work-dir", tmp_path / "b", "--out", tmp_path / "b_out", "--steps", 2])
    run("train_asr.py", common + ["--work-dir", tmp_path / "b", "--out", tmp_path / "b_out", "--steps", 4])
    a = ASRPipeline.from_pretrained(tmp_path / "a_out").recognizer.model.state_dict()
    b = ASRPipeline.from_pretrained(tmp_path / "b_out").recognizer.model.state_dict()
    start = ASRPipeline.from_pretrained(tmp_path / "init_out").recognizer.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(a["feature_mean"], start["feature_mean"])  # --init keeps the model's normalisation
    assert not all(torch.equal(a[k], start[k]) for k in a)  # and trains from its weights
