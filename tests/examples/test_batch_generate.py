"""examples/batch_generate.py: per-sample seeds make output independent of batching, and it resumes."""

import json
import runpy
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "batch_generate.py"


def run(args):
    old = sys.argv
    sys.argv = [str(SCRIPT)] + args
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        sys.argv = old


def manifest(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


def test_batch_generate_is_batch_invariant_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("MMSPEC_KERNELS", "torch")
    common = ["--plugin", "speculative", "--num", "3", "--set", "max_new_tokens=8", "--set", "temperature=1.0"]
    run(common + ["--out", str(tmp_path / "a"), "--batch-size", "3"])
    run(common + ["--out", str(tmp_path / "b"), "--batch-size", "1"])
    a, b = manifest(tmp_path / "a"), manifest(tmp_path / "b")
    assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
    assert [r["index"] for r in a] == [0, 1, 2]

    # Resume: a deleted sample is regenerated identically, the others are left alone.
    (tmp_path / "a" / "000001.json").unlink()
    before = (tmp_path / "a" / "000000.json").stat().st_mtime_ns
    run(common + ["--out", str(tmp_path / "a"), "--batch-size", "3"])
    assert manifest(tmp_path / "a") == a
    assert (tmp_path / "a" / "000000.json").stat().st_mtime_ns == before
