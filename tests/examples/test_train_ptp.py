"""Smoke test of the `ptp` register training script: runs on the bundled page VLM, saves registers the plugin
loads, and an interrupted run resumes to the registers of an uninterrupted one: the same steps, batches and
best step, equal up to float32 rounding.

They need not be bitwise equal: the CPU's BLAS may pick its summation order by buffer alignment, which
differs between runs. Adam then turns rounding into whole updates for the few weights whose gradient is
near zero (it divides each gradient by its own size, so a flipped sign moves the weight by ~2 x lr). So the
check is per element: all but a tiny fraction agree to 1e-5, and none is further apart than a few updates.
A bug in the resumed state (learning rate, Adam moments, the batches) moves nearly every element."""

import json
import shutil

import pytest
import torch
from run_example import run_example

from mmspec import load_plugin
from mmspec.plugins.ptp.registers import RegisterSet

pytestmark = pytest.mark.train


LR = 2e-3


def train(work, out, steps, stop_after=None):
    args = ["--pages", 2, "--max-new-tokens", 24, "--num-registers", 3, "--anchors", 4, "--rank", 2,
            "--steps", steps, "--lr", LR, "--batch-size", 3, "--checkpoint-every", 1, "--work-dir", work, "--out", out]
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
    a = torch.cat([t.flatten() for t in straight.state_dict().values()])
    b = torch.cat([t.flatten() for t in resumed.state_dict().values()])
    apart = (a - b).abs()
    far = (apart > 1e-5 + 1e-5 * a.abs()).float().mean().item()
    assert far < 1e-3 and apart.max() < 3 * 2 * LR, f"{far:.2%} of {a.numel()} differ; max {apart.max():.2e}"
    best_step = [json.loads((tmp_path / out / "training.json").read_text())["step"] for out in ("out_a", "out_b")]
    assert best_step[0] == best_step[1]
    pipe = load_plugin("ptp", model="doc-tiny", num_draft_tokens=3, registers_path=str(tmp_path / "out_a"))
    assert pipe.plugin.registers().num_registers == 3
