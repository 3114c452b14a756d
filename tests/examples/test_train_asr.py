"""Smoke tests of the ASR data and training scripts: espeak-ng synthesis of a few sentences (the
espeakng-loader wheel, the committed sentence list), a few training steps that resume exactly, and the saved
folder loads as an ASRPipeline."""

from pathlib import Path

import torch

from mmspec.speech.data import load_test_set
from mmspec.speech.pipeline import ASRPipeline

from run_example import run_example

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
