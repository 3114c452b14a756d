"""`ssd`: greedy output identical to AR, the sampling law (and a biased rule caught), CFG, ragged batches,
the drafter's use of the row above, the bundled heads, bad inputs."""

import itertools

import pytest
import torch
from scipy.stats import chisquare

from mmspec.common.accept import AcceptAll
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import CFGModel
from mmspec.common.registry import get_plugin_class
from mmspec.plugins.ssd import BUNDLED_HEADS, SpatialHeads
from mmspec.vision.llamagen import LlamaGenAdapter, LlamaGenModel

pytestmark = pytest.mark.usefixtures("torch_kernels_module")

GRID = 4


def tiny_gen(vocab=16, grid=GRID, seed=0, std=0.3):
    torch.manual_seed(seed)
    model = LlamaGenModel(dim=32, n_layer=2, n_head=2, num_classes=3, vocab_size=vocab, block_size=grid * grid,
                          token_dropout_p=0.0, resid_dropout_p=0.0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model


def random_heads(model, width, seed=1):
    torch.manual_seed(seed)
    heads = SpatialHeads(hidden_size=model.config.dim, vocab_size=model.config.vocab_size, grid_width=width)
    heads.init_from_lm_head(model.output.weight)
    with torch.no_grad():
        heads.right.block.weight.normal_(0, 0.2)
        heads.below.block.weight.normal_(0, 0.2)
        heads.prior_logits.normal_(0, 1)
    return heads.eval()


def ssd_decoder(model, heads, logits, grid, k, guidance=None):
    plugin = get_plugin_class("ssd")(num_draft_tokens=k)
    plugin._heads = heads
    target = LlamaGenAdapter(model)
    if guidance is not None:
        target = CFGModel(target, guidance)
    return plugin.build_decoder(None, target, logits, grid=grid)


def prompts(model, labels, guidance):
    cond = model.class_token(torch.tensor(labels))[:, None]
    if guidance is None:
        return cond, None
    uncond = model.class_token(torch.full((len(labels),), model.null_class))[:, None]
    return cond, (torch.cat([cond, uncond]), None)


@pytest.mark.parametrize("k,guidance", [(1, None), (3, 2.5), (2, None)])
def test_greedy_equals_ar(k, guidance):
    model = tiny_gen()
    heads = random_heads(model, GRID)
    cond, prefill = prompts(model, [0, 2, 1], guidance)
    greedy = LogitsPipeline(temperature=0)
    target = LlamaGenAdapter(model) if guidance is None else CFGModel(LlamaGenAdapter(model), guidance)
    ar = get_plugin_class("ar")().build_decoder(None, target, greedy).generate(
        cond, max_new_tokens=GRID * GRID, prefill_input=prefill)
    out = ssd_decoder(model, heads, greedy, (GRID, GRID), k, guidance).generate(
        cond, max_new_tokens=GRID * GRID, prefill_input=prefill)
    assert torch.equal(out.sequences, ar.sequences)


def test_drafts_come_from_the_row_above():
    """Heads that copy: the below head returns the source token itself, so once row 0 is known, the
    drafts for row 1 are row 0's tokens; with a target that repeats rows, every draft is accepted."""
    model = tiny_gen()
    heads = random_heads(model, GRID)
    drafter = ssd_decoder(model, heads, LogitsPipeline(temperature=0), (GRID, GRID), 3).drafter
    drafter.begin(None, None)
    ctx = type("Ctx", (), {})()
    ctx.last_tokens, ctx.positions = torch.tensor([16]), torch.tensor([0])
    ctx.num_draft_tokens, ctx.logits, ctx.generator = 3, LogitsPipeline(temperature=0), None
    first = drafter.propose(ctx)  # nothing verified yet: every draft is the prior's argmax
    assert first.tokens.tolist() == [[int(heads.prior_logits.argmax())] * 3]
    # Mark the states of tokens 0..3 known with one-hot-like values and make the below head read them.
    hidden = torch.zeros(1, 5, 32)
    for j in range(5):
        hidden[0, j, j] = 10.0
    with torch.no_grad():
        heads.below.block.weight.zero_()
        heads.below.block.bias.zero_()
        heads.below.out.weight.zero_()
        for j in range(1, 5):  # state of generated token j−1 (slot j) -> code 7 + j
            heads.below.out.weight[7 + j, j] = 1.0
    drafter.store.cond[:, :5] = hidden
    drafter.store.known[:, :5] = True
    ctx.positions = torch.tensor([GRID + 1])  # newest token = generated index GRID (row 1, column 0)
    draft = drafter.propose(ctx)
    # draft i=2,3 at generated indices GRID+2, GRID+3 read tokens 2, 3 (slots 3, 4) -> codes 10, 11
    assert draft.tokens[0, 1:].tolist() == [10, 11]


LAW_H, LAW_W, LAW_VOCAB, LAW_SAMPLES = 2, 3, 3, 20_000


def grid_law(model, label):
    seqs = torch.tensor(list(itertools.product(range(LAW_VOCAB), repeat=LAW_H * LAW_W)))
    cls = model.class_token(torch.full((len(seqs), 1), label))
    with torch.no_grad():
        probs = model(torch.cat([cls, seqs], 1)).softmax(-1)[:, :-1]
    return probs.gather(2, seqs[:, :, None]).squeeze(2).prod(1)


def pvalue(decoder, model, law):
    cond = model.class_token(torch.full((LAW_SAMPLES, 1), 1))
    out = decoder.generate(cond, max_new_tokens=LAW_H * LAW_W, generator=torch.Generator().manual_seed(0))
    code = (out.sequences * LAW_VOCAB ** torch.arange(LAW_H * LAW_W - 1, -1, -1)).sum(1)
    counts = torch.bincount(code, minlength=LAW_VOCAB ** (LAW_H * LAW_W)).double()
    expected = law.double() * LAW_SAMPLES
    keep = expected >= 5
    obs = torch.cat([counts[keep], counts[~keep].sum()[None]])
    exp = torch.cat([expected[keep], expected[~keep].sum()[None]])
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue), out.stats


def test_sampling_follows_the_ar_law_and_a_biased_rule_is_caught():
    model = tiny_gen(vocab=LAW_VOCAB, grid=3, seed=3, std=0.8)
    heads = random_heads(model, LAW_W, seed=4)
    logits = LogitsPipeline(temperature=1.0)
    law = grid_law(model, 1)
    decoder = ssd_decoder(model, heads, logits, (LAW_H, LAW_W), 2)
    p, stats = pvalue(decoder, model, law)
    assert p > 1e-3
    assert 1.2 < stats.mean_accepted < 3.0  # drafts are both accepted and rejected
    decoder.accept_rule = AcceptAll()
    assert pvalue(decoder, model, law)[0] < 1e-6


def test_rows_do_not_depend_on_their_batch():
    model = tiny_gen()
    heads = random_heads(model, GRID)
    decoder = ssd_decoder(model, heads, LogitsPipeline(temperature=1.0, top_k=8), (GRID, GRID), 3, guidance=2.0)
    cond, prefill = prompts(model, [0, 1, 2], 2.0)
    gens = lambda seeds: [torch.Generator().manual_seed(s) for s in seeds]  # noqa: E731
    steps = []
    batch = decoder.generate(cond, max_new_tokens=GRID * GRID, generator=gens([3, 4, 5]), prefill_input=prefill,
                             callback=lambda step, info: steps.append(info["num_accepted"].tolist()))
    one, one_prefill = prompts(model, [1], 2.0)
    alone = decoder.generate(one, max_new_tokens=GRID * GRID, generator=gens([4]), prefill_input=one_prefill)
    assert torch.equal(batch.sequences[1], alone.sequences[0])
    assert any(len(set(n)) > 1 for n in steps), "acceptance should be ragged across rows"


@pytest.mark.skipif(not (BUNDLED_HEADS / "config.json").exists(), reason="bundled heads not trained yet")
def test_bundled_heads_beat_the_prior():
    """On the bundled model, the trained heads' drafts are accepted far more often than prior drafts."""
    from mmspec.plugins.ssd import load_bundled_heads
    from mmspec.vision.pipeline import bundled_pipeline

    pipe = bundled_pipeline()
    pipe.set_progress_bar_config(disable=True)
    heads = load_bundled_heads()
    assert heads.config.grid_width == pipe.grid_size
    get_plugin_class("ssd")().attach(pipe)
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    out = pipe(class_labels=[0, 5], generator=gens, output_type="pt")
    assert out.stats.mean_accepted > 1.5
    assert out.stats.nfe_per_sample < 256 / 1.5


def test_bad_inputs():
    plugin_cls = get_plugin_class("ssd")
    model = tiny_gen()
    with pytest.raises(ValueError, match="num_draft_tokens"):
        plugin_cls(num_draft_tokens=0)
    with pytest.raises(ValueError, match="grid width"):
        ssd_decoder(model, random_heads(model, GRID), LogitsPipeline(), (GRID, GRID), GRID)
    with pytest.raises(ValueError, match="2-D grid"):
        ssd_decoder(model, random_heads(model, GRID), LogitsPipeline(), None, 2)
    with pytest.raises(ValueError, match="trained for grid width"):
        ssd_decoder(model, random_heads(model, GRID + 2), LogitsPipeline(), (GRID, GRID), 2)
    wrong_vocab = SpatialHeads(hidden_size=32, vocab_size=7, grid_width=GRID)
    with pytest.raises(ValueError, match="vocabulary"):
        ssd_decoder(model, wrong_vocab, LogitsPipeline(), (GRID, GRID), 2)
    with pytest.raises(ValueError, match="heads_path"):
        plugin_cls(heads_path="/nonexistent/heads").build_decoder(None, LlamaGenAdapter(model), LogitsPipeline(),
                                                                 grid=(GRID, GRID))
