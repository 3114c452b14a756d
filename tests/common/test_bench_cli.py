"""`mmspec bench` / `list` / `generate` on the bundled text pair, and the bench JSON contract."""

import json

import pytest

from mmspec.common import cli
from mmspec.common.bench import parse_settings, run_bench, write_markdown

CONTRACT = ["plugin", "model", "device", "num_samples", "batch_size", "seed", "lossless", "baseline",
            "accelerated", "step_compression", "speedup", "exact_match_rate"]
SMALL = {"max_new_tokens": 12}


# The Triton path is covered by test_kernels; under the interpreter these decode loops would take minutes.
pytestmark = [pytest.mark.usefixtures("torch_kernels_module"), pytest.mark.e2e]


@pytest.fixture(scope="module")
def spec_result():
    return run_bench("speculative", num_samples=3, batch_size=2, seed=0, settings=SMALL, progress=lambda _: None)


def test_bench_json_contract(spec_result):
    for key in CONTRACT:
        assert key in spec_result
    for side in ("baseline", "accelerated"):
        assert {"nfe_per_sample", "latency_s_per_sample", "quality"} <= set(spec_result[side])
    assert {"mean_accepted", "acceptance_per_position"} <= set(spec_result["accelerated"])
    json.dumps(spec_result)  # serialisable


def test_bench_speculative_is_lossless_and_compresses(spec_result):
    assert spec_result["lossless"] is True
    assert spec_result["exact_match_rate"] == 1.0
    assert spec_result["baseline"]["nfe_per_sample"] == 12
    assert spec_result["baseline"]["mean_accepted"] == 1.0
    assert spec_result["accelerated"]["nfe_per_sample"] < 12
    assert spec_result["step_compression"] > 1
    assert spec_result["accelerated"]["quality"]["target_nll"] == pytest.approx(
        spec_result["baseline"]["quality"]["target_nll"], rel=1e-4)
    # lossless and greedy: the same outputs, so no quality cost and no spread in its interval
    cost = spec_result["quality_cost"]["target_nll"]
    assert cost["n"] == 3 and cost["delta"] == pytest.approx(0, abs=1e-4)
    assert cost["low"] == pytest.approx(0, abs=1e-4) and cost["high"] == pytest.approx(0, abs=1e-4)
    assert "per_sample" not in spec_result["baseline"]["quality"]  # the parts stay out of the row


def test_bench_runs_the_peer_side_by_side(spec_result):
    peer = spec_result["peer"]
    assert peer["name"] == "transformers assisted generation"
    assert peer["nfe_per_sample"] > 0 and peer["latency_s_per_sample"] > 0
    assert peer["exact_match_rate_vs_ar"] == 1.0


def test_profile_splits_each_step_and_explains_the_speedup(spec_result):
    from mmspec.common.profile import PHASES, format_profile, step_profile

    prof = step_profile(spec_result)
    base, acc = prof["baseline"], prof["accelerated"]
    # a step is one target forward: the phases add up to the decode loop's time (prefill apart)
    for side, row in ((base, spec_result["baseline"]), (acc, spec_result["accelerated"])):
        split = row["time_split_s"]
        assert side["steps"] == row["target_nfe"]
        assert sum(side["per_step_s"][p] for p in PHASES) * side["steps"] == pytest.approx(
            split["total"] - split["prefill"], rel=1e-6)
        assert split["prefill"] > 0
    assert spec_result["baseline"]["target_width"] == 1.0  # plain AR feeds one token per row
    drafts = spec_result["config"]["num_draft_tokens"]
    assert prof["verify_width"] == 1 + drafts  # the last token and the chain's drafts
    assert base["per_step_s"]["draft"] == 0 and acc["per_step_s"]["draft"] > 0
    assert prof["drafter"]["per_step"] == spec_result["accelerated"]["drafter_nfe"] / acc["steps"]
    assert prof["loop_speedup"] == pytest.approx(base["loop_s"] / acc["loop_s"], rel=1e-6)
    assert prof["forwards_saved"] == base["steps"] / acc["steps"] > 1
    assert prof["bound"] in PHASES
    assert prof["extra_per_step_s"][prof["bound"]] == max(prof["extra_per_step_s"].values())
    text = format_profile(spec_result)
    assert f"verifying {1 + drafts:.1f} tokens costs" in text and f"most from {prof['bound']}" in text
    # a row written before the step timers says so instead of inventing a split
    old = {**spec_result, "baseline": {**spec_result["baseline"], "time_split_s": {"draft": 0.0}}}
    assert step_profile(old) is None and "no per-step timers" in format_profile(old)


def test_bench_sampling_reports_no_exact_match():
    result = run_bench("speculative", num_samples=2, settings={**SMALL, "temperature": 1.0, "top_k": 20},
                       progress=lambda _: None)
    assert result["exact_match_rate"] is None


def test_bench_markdown(spec_result, tmp_path):
    path = tmp_path / "BENCH.md"
    write_markdown([spec_result], path, "mmspec bench speculative")
    text = path.read_text()
    assert "| speculative |" in text and "transformers assisted generation" in text
    assert "## Where the time goes" in text


@pytest.mark.parametrize("settings, match", [
    ({"num_draft_tokens": 0}, "num_draft_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"bogus": 1}, "unknown --set key"),
])
def test_bench_bad_settings(settings, match):
    with pytest.raises(ValueError, match=match):
        run_bench("speculative", num_samples=1, settings={**SMALL, **settings}, progress=lambda _: None)


def test_bench_bad_arguments():
    with pytest.raises(KeyError, match="available"):
        run_bench("nope")
    with pytest.raises(ValueError, match="batch_size"):
        run_bench("speculative", batch_size=0)
    with pytest.raises(ValueError, match="model must be one of"):
        run_bench("speculative", model="no-such-model")


def test_parse_settings():
    assert parse_settings(["a=1", "b=0.5", "c=true", "d=none", "e=3,2,1"]) == {
        "a": 1, "b": 0.5, "c": True, "d": None, "e": "3,2,1"}
    with pytest.raises(ValueError, match="key=value"):
        parse_settings(["novalue"])


def test_cli_list(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "speculative" in out and "lossless" in out and "Leviathan" in out


def test_cli_bench_writes_json(tmp_path, capsys):
    path = tmp_path / "r.json"
    assert cli.main(["bench", "speculative", "--num-samples", "1", "--set", "max_new_tokens=8",
                     "--json", str(path), "--quiet"]) == 0
    assert json.loads(path.read_text())["plugin"] == "speculative"
    compact = capsys.readouterr().out
    assert "step compr." in compact and "latency s/sample (AR → plugin)" not in compact  # compact by default
    assert cli.main(["bench", "speculative", "--num-samples", "1", "--set", "max_new_tokens=8", "--quiet",
                     "--wide"]) == 0
    assert "latency s/sample (AR → plugin)" in capsys.readouterr().out
    assert cli.main(["bench", "speculative", "--num-samples", "1", "--set", "max_new_tokens=8", "--quiet",
                     "--profile"]) == 0
    out = capsys.readouterr().out
    assert "where the time goes: speculative" in out and "bound: a plugin step costs" in out


def test_cli_errors_are_clear(capsys):
    assert cli.main(["bench", "nope", "--quiet"]) == 2
    assert "available" in capsys.readouterr().err
    assert cli.main(["bench", "speculative", "--set", "num_draft_tokens=0", "--quiet"]) == 2
    assert "num_draft_tokens" in capsys.readouterr().err


def test_cli_generate(tmp_path, capsys):
    out = tmp_path / "gen.json"
    assert cli.main(["generate", "speculative", "--prompt", "Return the", "--set", "max_new_tokens=8",
                     "--out", str(out)]) == 0
    samples = json.loads(out.read_text())["samples"]
    assert samples[0]["prompt"] == "Return the" and len(samples[0]["completion"]) > 0


def test_generate_compare_runs_ar_on_the_same_inputs(capsys):
    assert cli.main(["generate", "speculative", "--num", "2", "--set", "max_new_tokens=12", "--compare"]) == 0
    out = capsys.readouterr().out
    assert "speculative vs plain AR on the same 2 inputs and seeds" in out
    assert "outputs identical to AR: 2 of 2\n" in out  # greedy and lossless
    assert ("quality (AR -> plugin, n = 2; small n: mostly noise; in brackets: the 95% interval of the "
            "difference): target_nll") in out and "(+0 [+0, +0])" in out
    assert "an interval that holds 0" in out
    assert "saved no target forwards" not in out and "almost never accepted" not in out  # the draft model drafts


def test_bench_measures_a_saved_pipeline_folder(tmp_path):
    """`--model FOLDER`: a pipeline written by save_pretrained is benched like a bundled model (the folder names
    its pipeline); a folder that holds none, or no folder at all, is one clear line."""
    from mmspec import load_plugin

    load_plugin("speculative").save_pretrained(tmp_path / "mine")
    row = run_bench("speculative", model=str(tmp_path / "mine"), num_samples=2, settings=SMALL,
                    progress=lambda _: None)
    assert row["model"] == str(tmp_path / "mine") and row["exact_match_rate"] == 1.0
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a saved mmspec pipeline"):
        run_bench("speculative", model=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="no such folder"):
        run_bench("speculative", model=str(tmp_path / "nope"))


def test_a_plugin_that_saves_nothing_says_so_and_what_to_change(tmp_path, capsys):
    """An EAGLE head with scrambled weights (as good as a head trained for another model) under greedy decoding
    on a tree: drafts are never accepted; `--compare` and the printed DecodeStats say so, with the knobs."""
    import torch

    from mmspec.plugins.lantern.drafter import EagleHead
    from mmspec.plugins.lantern.plugin import BUNDLED_EAGLE_HEAD

    head = EagleHead.from_pretrained(BUNDLED_EAGLE_HEAD)
    torch.manual_seed(0)
    with torch.no_grad():
        for weight in head.parameters():
            weight.copy_(torch.randn_like(weight) * 0.5)
    head.save_pretrained(tmp_path / "scrambled")
    assert cli.main(["generate", "eagle", "--num", "2", "--batch-size", "2", "--set", "temperature=0", "--set",
                     "tree_branching=2,1", "--set", f"head_path={tmp_path / 'scrambled'}", "--compare",
                     "--out", str(tmp_path / "grid.png")]) == 0
    out = capsys.readouterr().out
    assert "drafts almost never accepted: no target forwards saved" in out  # the plugin run's DecodeStats
    assert "eagle saved no target forwards here: its drafts were almost never accepted" in out
    hints = [line for line in out.splitlines() if line.startswith("    - ")]
    assert "mmspec train-head eagle" in hints[0] and "temperature=1" in hints[1] and "chain" in hints[2]
