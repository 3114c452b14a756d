"""README "Bring your own model", run as written: a tiny random Janus saved as a folder, an EAGLE head trained
for it by `mmspec train-head`, `lantern` at delta=0 greedy giving plain AR's images with `--compare`, and a
bench JSON. The commands run in this process (`cli.main`), with the README's own arguments."""

import json
import re
import shlex
from pathlib import Path

import pytest
import torch

from mmspec.common import cli

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"


def walkthrough(name: str) -> tuple[str, list[list[str]]]:
    text = README.read_text()
    section = re.search(rf"<!-- walkthrough: {name} .*?-->(.*?)<!-- /walkthrough -->", text, re.S).group(1)
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shell = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [shlex.split(line) for line in shell.splitlines() if line.strip() and not line.startswith("#")]
    return python, commands


def test_bring_your_own_model_walkthrough(tmp_path, monkeypatch, capsys):
    python, commands = walkthrough("byo")
    assert [c[:2] for c in commands] == [["mmspec", "train-head"], ["mmspec", "generate"], ["mmspec", "bench"]]
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(python, "README.md", "exec"), {})
    assert (tmp_path / "my_janus" / "mmspec_pipeline.json").exists()

    assert cli.main(commands[0][1:]) == 0
    out = capsys.readouterr().out
    before = float(re.search(r"expected acceptance before training: ([0-9.]+)", out).group(1))
    final = float(re.findall(r"held-out expected acceptance ([0-9.]+)", out)[-1])
    assert final > before + 0.05, out  # the head learned to draft for this model
    assert "--set head_path=my_janus_head" in out

    assert cli.main(commands[1][1:]) == 0
    out = capsys.readouterr().out
    assert "wrote 4 images to janus.png (prompts: a red cat; a boat on the sea)" in out
    assert "outputs identical to AR: 4 of 4" in out
    assert (tmp_path / "janus.png").exists()

    assert cli.main(commands[2][1:]) == 0
    row = json.loads((tmp_path / "my_janus_bench.json").read_text())
    assert row["plugin"] == "lantern" and row["model"] == "my_janus" and row["num_samples"] == 8
    assert row["baseline"]["quality"]["nll"] > 0 and row["accelerated"]["quality"]["nll"] > 0
    # the head drafts tokens the target keeps
    assert row["accelerated"]["nfe_per_sample"] < row["baseline"]["nfe_per_sample"] == 16
