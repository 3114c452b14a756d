"""Smoke test of the bundled text pair's training script: runs, saves loadable models, resumes exactly."""

import runpy
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.train

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_text_pair.py"


def train(tmp_path, work, out, target_steps, draft_steps):
    argv = [str(SCRIPT), "--target-steps", str(target_steps), "--draft-steps", str(draft_steps),
            "--batch-size", "2", "--seq-len", "32", "--ckpt-every", "1",
            "--work-dir", str(tmp_path / work), "--out", str(tmp_path / out)]
    old = sys.argv
    sys.argv = argv
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = old
    return {name: load_file(tmp_path / out / name / "model.safetensors") for name in ("target", "draft")}


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_train_text_pair_runs_and_resumes_deterministically(tmp_path, capsys):
    straight = train(tmp_path, "a", "out_a", 3, 2)
    # Interrupted twice: once inside the target's training, once inside the draft's.
    train(tmp_path, "b", "out_b1", 2, 0)
    train(tmp_path, "b", "out_b2", 3, 1)
    resumed = train(tmp_path, "b", "out_b", 3, 2)
    log = capsys.readouterr().out
    assert "[target] resumed at step 2" in log and "[draft] resumed at step 1" in log
    for name in ("target", "draft"):
        assert straight[name].keys() == resumed[name].keys()
        for key in straight[name]:
            assert torch.equal(straight[name][key], resumed[name][key]), (name, key)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tmp_path / "out_a" / "target")
    assert model.config.vocab_size == 258
