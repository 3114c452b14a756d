"""The prepared GPU benchmark's parts that need no GPU, on this CPU (`examples/gpu_bench.py --smoke`)."""

import json
import shutil
from pathlib import Path

import pytest
from run_example import run_example

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_bench_smoke_runs_every_part_and_writes_its_section(tmp_path, monkeypatch):
    monkeypatch.setenv("MMSPEC_KERNELS", "torch")  # the plugin rows; the kernel part picks both backends itself
    shutil.copy(ROOT / "benchmarks.json", tmp_path / "benchmarks.json")
    out, markdown = tmp_path / "benchmarks_gpu.json", tmp_path / "BENCHMARKS.md"
    run_example("gpu_bench.py", ["--smoke", "--only", "speculative", "--out", out, "--markdown", markdown])
    report = json.loads(out.read_text())
    # Every native kernel ran on both backends (Triton under the interpreter) and agreed with its reference.
    assert len(report["kernels"]) == 8
    for kernel in report["kernels"]:
        assert "error" not in kernel and kernel["agree"] is True, kernel
        assert kernel["torch_s"] > 0 and kernel["triton_s"] > 0
    rows = report["plugins"]
    assert [(r["plugin"], r["batch_size"]) for r in rows] == [("speculative", 1), ("speculative", 8)]
    for r in rows:
        assert "error" not in r and r["speedup"] > 0 and r["exact_match_rate"] == 1.0, r
        assert r["bound"] in ("draft", "verify", "accept", "other")
    assert "skipped" in report["syncs"]
    [compiled] = report["compile"]  # aot_eager on a CPU: graph capture at static shapes, outputs as eager
    assert "error" not in compiled and compiled["identical_outputs"] == {"ar": 1.0, "plugin": 1.0}, compiled
    plan = report["tree_plan"]  # speculative's text pair at toy sizes: the planner runs end to end
    assert "error" not in plan and plan["best"]["ms_per_step"] > 0 and plan["best_chain"] is not None
    text = markdown.read_text()
    assert "The draft tree planned for this machine" in text and "speculative's best is" in text
    assert "## On a GPU" in text and "a smoke run" in text and "| speculative | 8 |" in text
    assert "| sjd | llamagen-tiny | 1 | aot_eager |" in text
    assert "| eagle | defaults | llamagen-tiny |" in text  # the rest of BENCHMARKS.md is rendered as before


def test_gpu_bench_without_a_gpu_says_so_instead_of_timing_the_cpu():
    with pytest.raises(SystemExit, match="no CUDA GPU here; use --smoke"):
        run_example("gpu_bench.py", [])
