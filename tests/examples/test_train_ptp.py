"""Smoke test of the `ptp` register training script: runs on the bundled page VLM, saves registers the plugin
loads, and an interrupted run resumes to the registers of an uninterrupted one: the same steps, batches and
best step, equal up to float32 rounding. They are not bitwise equal because the CPU's BLAS picks its
summation order by buffer alignment, which differs between processes; a bug in the resumed state (LR, moments,
batches) shows up as differences around 1e-4, not 1e-8."""

import shutil

import pytest
import torch
from run_example import run_example

from mmspec import load_plugin
from mmspec.plugins.ptp.registers import RegisterSet


def train(work, out, steps, stop_after=None):
    args = ["--pages", 2, "--max-new-tokens", 24, "--num-registers", 3, "--anchors", 4, "--rank", 2,
            "--steps", steps, "--batch-size", 3, "--checkpoint-every", 1, "--work-dir", work, "--out", out]
    run_example("train_ptp.py", args + (["--stop-after", stop_after] if stop_after else []))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_train_ptp_runs_and_resumes_to_the_same_registers(tmp_path, capsys):
    train(tmp_path / "a", tmp_path / "out_a", 3)
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / "data.pt", tmp_path / "b" / "data.pt")  # the same sequences, not made again
    train(tmp_path / "b", tmp_path / "out_b", 3, stop_after=2)
    assert not (tmp_path / "out_b").exists()  # stopped early: nothing shipped yet
    train(tmp_path / "b", tmp_path / "out_b", 3)
    assert "resumed at step 2" in capsys.readouterr().out
    straight, resumed = RegisterSet.from_pretrained(tmp_path / "out_a"), RegisterSet.from_pretrained(tmp_path / "out_b")
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    pipe = load_plugin("ptp", model="doc-tiny", num_draft_tokens=3, registers_path=str(tmp_path / "out_a"))
    assert pipe.plugin.registers().num_registers == 3
