"""Continuous batching in the core loop: with max_batch_size below the number of rows, waiting rows are
prefilled into the places finished rows leave, and every row's output equals decoding it alone — greedy and
sampled (one generator per row), with a draft model, Jacobi windows, an EAGLE head, CFG pairs and ragged EOS."""

import pytest
import torch
from tiny_models import perturbed_copy, tiny_llama

from mmspec.common.accept import GreedyMatch, SpeculativeSampling
from mmspec.common.decoder import ArrivingRows, SpeculativeDecoder
from mmspec.common.draft import Drafter, DraftModelDrafter
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import CFGModel, HFCausalLM
from mmspec.plugins.jacobi.drafter import JacobiDrafter
from mmspec.plugins.lantern.drafter import EagleDrafter, EagleHead

EOS = 2
ROWS = 7


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(vocab_size=16, seed=5)
    return target, perturbed_copy(target, 0.3)


def decoder(kind, target, draft, logits):
    rule = GreedyMatch() if logits.greedy else SpeculativeSampling()
    adapter = HFCausalLM(target)
    if kind in ("cfg", "eagle_cfg"):
        adapter = CFGModel(adapter, 2.0)
    if kind in ("ar", "cfg"):
        return SpeculativeDecoder(adapter, logits=logits, eos_token_id=EOS, pad_token_id=EOS)
    if kind == "eagle_cfg":  # an untrained head drafts poorly but verifiably: acceptance is ragged
        torch.manual_seed(0)
        drafter = EagleDrafter(EagleHead.for_target(adapter), adapter)
    else:
        drafter = DraftModelDrafter(HFCausalLM(draft)) if kind == "draft_model" else JacobiDrafter(16, 4)
    return SpeculativeDecoder(adapter, drafter, rule, logits, num_draft_tokens=4, eos_token_id=EOS, pad_token_id=EOS)


def prompts():
    gen = torch.Generator().manual_seed(4)
    lengths = [1, 4, 2, 5, 3, 1, 4]
    ids = torch.zeros(ROWS, max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for row, n in enumerate(lengths):  # right-padded, ragged prompts
        ids[row, :n], mask[row, :n] = torch.randint(4, 16, (n,), generator=gen), True
    return ids, mask


def run(kind, models, logits, rows, max_batch_size=None):
    ids, mask = prompts()
    ids, mask = ids[rows], mask[rows]
    gens = [torch.Generator().manual_seed(100 + r) for r in rows]
    prefill = None
    if kind in ("cfg", "eagle_cfg"):  # unconditional rows: the prompt with its first token replaced by 0
        uncond = ids.clone()
        uncond[:, 0] = 0
        prefill = (torch.cat([ids, uncond]), torch.cat([mask, mask]))
    return decoder(kind, *models, logits).generate(ids, mask, max_new_tokens=30, generator=gens,
                                                   prefill_input=prefill, max_batch_size=max_batch_size)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["ar", "draft_model", "jacobi", "cfg", "eagle_cfg"])
def test_refilled_rows_equal_each_row_alone(models, kind, temperature, torch_kernels):
    logits = LogitsPipeline(temperature=temperature)
    refilled = run(kind, models, logits, list(range(ROWS)), max_batch_size=3)
    assert refilled.stats.extra["admitted_rows"] == ROWS - 3
    assert refilled.stats.num_rows == ROWS and len(refilled.stats.row_forwards) == ROWS
    lengths = []
    for row in range(ROWS):
        alone = run(kind, models, logits, [row])
        n = int(alone.lengths[0])
        assert int(refilled.lengths[row]) == n, f"row {row}"
        assert torch.equal(refilled.sequences[row, :n], alone.sequences[0, :n]), f"row {row}"
        assert refilled.stats.row_forwards[row] == alone.stats.target_nfe, f"row {row}"
        lengths.append(n)
    assert len(set(lengths)) > 2, "EOS must make the rows ragged for this test to mean anything"


@pytest.mark.parametrize("max_batch_size", [None, 3])
def test_each_row_is_reported_once_at_the_step_it_finishes(models, max_batch_size):
    """The step callback's `FinishedRows`: what lets a caller hand a request on before the call returns."""
    reports, steps = [], []

    def callback(step, info):
        steps.append(step)
        if info["finished"] is not None:
            reports.extend((step, *row) for row in info["finished"].rows())

    ids, mask = prompts()
    gens = [torch.Generator().manual_seed(100 + r) for r in range(ROWS)]
    out = decoder("draft_model", *models, LogitsPipeline(temperature=1.0)).generate(
        ids, mask, max_new_tokens=30, generator=gens, callback=callback, max_batch_size=max_batch_size)
    assert sorted(r[1] for r in reports) == list(range(ROWS))  # every row, once
    for step, row, tokens, forwards, committed in reports:
        assert tokens == out.sequences[row, :int(out.lengths[row])].tolist(), f"row {row}"
        assert (forwards, committed) == (out.stats.row_forwards[row], out.stats.row_committed[row])
    assert len({r[0] for r in reports}) > 2 and reports[0][0] < steps[-1]  # ragged: reported along the way


def test_a_decoder_that_cannot_refill_says_why_and_the_pipeline_hook_runs_batches_in_turn(models):
    class Opaque(Drafter):  # keeps per-row state but never learnt to admit rows
        def propose(self, ctx):
            raise AssertionError("not reached")

    opaque = SpeculativeDecoder(HFCausalLM(models[0]), Opaque(), num_draft_tokens=2)
    assert "cannot admit rows" in opaque.refill_blocker()
    with pytest.raises(ValueError, match="max_batch_size=2 < 7 rows needs continuous batching, but the drafter"):
        opaque.generate(prompts()[0], prompts()[1], max_new_tokens=4, max_batch_size=2)
    with pytest.raises(ValueError, match="max_batch_size must be an int >= 1 or None, got 0"):
        decoder("ar", *models, LogitsPipeline(temperature=0)).generate(prompts()[0], max_new_tokens=4,
                                                                        max_batch_size=0)


@pytest.mark.parametrize("plugin, config", [("sjd", {}), ("lantern++", {"tree_branching": "2,1,1"})])
def test_the_image_pipeline_refills_rows_with_the_same_images(plugin, config):
    """On the bundled model with CFG: a Jacobi-window plugin and a tree-drafting EAGLE-head plugin (the other
    refilling image plugins share these two drafters)."""
    from mmspec import load_plugin

    pipe = load_plugin(plugin, **config)  # a small tree: this runs on CPU in the test suite
    pipe.set_progress_bar_config(disable=True)
    assert pipe.continuous_batching_blocker() is None
    whole = pipe(class_labels=[1, 2, 3], temperature=0, output_type="pt")
    handed = []
    refilled = pipe(class_labels=[1, 2, 3], temperature=0, output_type="pt", max_batch_size=2,
                    on_sample_done=lambda *a: handed.append(a))
    assert torch.equal(whole.tokens, refilled.tokens)
    assert refilled.stats.extra["admitted_rows"] == 1 and len(refilled.stats.row_forwards) == 3
    assert sorted(i for i, _, _ in handed) == [0, 1, 2]  # each image handed on once, as its codes finished
    for i, image, statistics in handed:
        assert torch.equal(image, refilled.images[i]) and torch.equal(image, whole.images[i])
        assert statistics["target_forwards"] == refilled.stats.row_forwards[i]


def test_refill_bench_row_and_its_benchmarks_section(tmp_path):
    from mmspec.common.bench import write_markdown
    from mmspec.common.bench_refill import run_refill_bench

    row = run_refill_bench("speculative", num_samples=3, batch_size=2, rounds=1, progress=lambda *_: None,
                           settings={"max_new_tokens": 24})
    assert row["kind"] == "refill" and row["identical_outputs"]
    assert row["refill"]["admitted_rows"] == 1 and row["batches"]["admitted_rows"] == 0
    assert 0 < row["batches"]["occupancy"] <= 1 and 0 < row["refill"]["occupancy"] <= 1
    write_markdown([row], tmp_path / "B.md", "test")
    assert "## Continuous batching" in (tmp_path / "B.md").read_text()
    with pytest.raises(ValueError, match="plugin 'ssd' on llamagen-tiny: no continuous batching \\(the drafter"):
        run_refill_bench("ssd", progress=lambda *_: None)


def test_refill_bench_reads_the_inputs_its_settings_name():
    """The ASR pipeline's test set is a bench input setting: the refill row decodes that set and says so."""
    from mmspec.common.bench_refill import format_refill_table, run_refill_bench

    row = run_refill_bench("ctc_draft", num_samples=3, batch_size=2, rounds=1, progress=lambda *_: None,
                           settings={"test_set": "out_of_domain", "max_new_tokens": 24})
    assert row["input_settings"] == {"test_set": "out_of_domain"} and row["identical_outputs"]
    assert row["refill"]["admitted_rows"] >= 1  # (a clip with a long pause decodes as two utterances)
    assert "| ctc_draft (test_set=out_of_domain) | asr-tiny | 2 | 3 |" in format_refill_table([row])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["ar", "draft_model"])
def test_rows_that_arrive_mid_decode_equal_each_row_alone(models, kind, temperature, torch_kernels):
    """Every given row forks a branch once it has written 3 tokens: the branch's prompt is those tokens (a
    prompt longer than any given one, to widen the call's ids). Branches join the running call in arrival order
    and each decodes as it would alone, with its own generator; a cap of 4 rows holds some of them back."""
    logits = LogitsPipeline(temperature=temperature)
    ids, mask = prompts()
    forked, branch_prompts = set(), []

    def arrivals(step, info):
        new = []
        for row in info["rows"].tolist():
            if row < ROWS and row not in forked and int(info["lengths"][row]) >= 3:
                forked.add(row)
                new.append([row + 4] * 5 + info["sequences"][row, :3].tolist())
        if not new:
            return None
        branch_prompts.extend(new)
        gens = [torch.Generator().manual_seed(500 + len(branch_prompts) - len(new) + i) for i in range(len(new))]
        return ArrivingRows(torch.tensor(new), generator=gens)

    gens = [torch.Generator().manual_seed(100 + r) for r in range(ROWS)]
    out = decoder(kind, *models, logits).generate(ids, mask, max_new_tokens=30, generator=gens, arrivals=arrivals,
                                                  max_batch_size=4)
    assert len(branch_prompts) >= 5 and out.sequences.shape[0] == ROWS + len(branch_prompts)
    assert out.stats.num_rows == ROWS + len(branch_prompts)
    for i, prompt in enumerate(branch_prompts):
        alone = decoder(kind, *models, logits).generate(torch.tensor([prompt]), max_new_tokens=30,
                                                        generator=[torch.Generator().manual_seed(500 + i)])
        n = int(alone.lengths[0])
        assert int(out.lengths[ROWS + i]) == n and torch.equal(out.sequences[ROWS + i, :n], alone.sequences[0, :n])
        assert out.stats.row_forwards[ROWS + i] == alone.stats.target_nfe
    given = run(kind, models, logits, list(range(ROWS)))
    assert torch.equal(out.sequences[:ROWS], given.sequences) and torch.equal(out.lengths[:ROWS], given.lengths)
