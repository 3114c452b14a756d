"""`sjd`, `mc_sjd`, `gsd`: kernels against their references, greedy identity with AR, the output law
under sampling (with planted bugs that must be caught), ragged batches, the Janus adapter, bad inputs."""

import math

import pytest
import torch
from law import (
    ResidualFromTarget, exact_prompt_law, prompt_law_pvalue, sharpened_tiny_lm,
)
from scipy.stats import chisquare
from tiny_models import HF_GRID, build_tiny_janus, tiny_llama, tiny_text_tokenizer

from mmspec.common.accept import Acceptance, Draft, SpeculativeSampling
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import ARModel, HFCausalLM
from mmspec.common.registry import get_plugin_class
from mmspec.plugins.jacobi import GroupedAcceptance, JacobiDrafter
from mmspec.plugins.jacobi.kernels import (
    group_sums, group_sums_reference, maximal_coupling, maximal_coupling_reference, rank_window,
)
from mmspec.vision.pipeline import ARImagePipeline

VOCAB, NEW_TOKENS, SAMPLES, WINDOW = 4, 4, 30_000, 3
PROMPT = [1, 2]


def random_probs(n, vocab, seed, sharp=4.0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, vocab, generator=g) ** sharp
    return p / p.sum(1, keepdim=True)


# --------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------

def test_maximal_coupling_triton_matches_reference(monkeypatch):
    n, vocab = 48, 700  # vocab spans more than one Triton block
    q, p = random_probs(n, vocab, 0), random_probs(n, vocab, 1)
    p[:6] = q[:6]
    x = torch.multinomial(q, 1, generator=torch.Generator().manual_seed(2))[:, 0]
    u = torch.rand(2, n, generator=torch.Generator().manual_seed(3))
    monkeypatch.setenv("MMSPEC_KERNELS", "triton")
    tokens, kept = maximal_coupling(x, q, p, u[0], u[1])
    ref_tokens, ref_kept = maximal_coupling_reference(x, q, p, u[0], u[1])
    assert torch.equal(tokens, ref_tokens) and torch.equal(kept, ref_kept)
    assert kept[:6].all(), "identical distributions must keep every draft"
    assert not kept.all()


def test_maximal_coupling_law_and_keep_rate(torch_kernels):
    """Output ~ p exactly, and it keeps x ~ q with probability 1 − TV(p, q), the maximum."""
    vocab, n = 6, 60_000
    q, p = random_probs(1, vocab, 4, sharp=2)[0], random_probs(1, vocab, 5, sharp=2)[0]
    g = torch.Generator().manual_seed(6)
    x = torch.multinomial(q, n, replacement=True, generator=g)
    u = torch.rand(2, n, generator=g)
    tokens, kept = maximal_coupling(x, q.expand(n, -1), p.expand(n, -1), u[0], u[1])
    counts = torch.bincount(tokens, minlength=vocab).double()
    assert chisquare(counts.numpy(), (p.double() * n).numpy()).pvalue > 1e-3
    tv = 0.5 * (p - q).abs().sum()
    assert abs(kept.float().mean() - (1 - tv)) < 4 * math.sqrt(0.25 / n)


def test_rank_window_and_group_sums(monkeypatch):
    p = torch.tensor([[0.05, 0.40, 0.10, 0.30, 0.15]])
    x = torch.tensor([2])  # rank 3 of [1, 3, 4, 2, 0]
    assert rank_window(p, x, 1).tolist() == [[4, 2, 0]]
    assert rank_window(p, torch.tensor([1]), 2).tolist() == [[-1, -1, 1, 3, 4]]
    q = torch.full((1, 5), 0.2)
    emb = torch.tensor([[0.0], [10.0], [0.1], [0.2], [0.3]])
    cand = rank_window(p, x, 2)  # [3, 4, 2, 0, -1]
    # gap 0.1 keeps 4 (0.15) and 0 (0.05), drops 3 (0.30); distance < 0.05 keeps both
    pp, pq = group_sums_reference(x, cand, p, q, emb, 0.1, 0.05)
    assert torch.allclose(pp, torch.tensor([0.30])) and torch.allclose(pq, torch.tensor([0.6]))
    pp, _ = group_sums_reference(x, cand, p, q, emb, 0.1, 0.02)  # now 4 is too far in embedding
    assert torch.allclose(pp, torch.tensor([0.15]))
    n, vocab = 40, 300
    tp, dp = random_probs(n, vocab, 7), random_probs(n, vocab, 8)
    tokens = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(9))
    emb = torch.randn(vocab, 150, generator=torch.Generator().manual_seed(10))
    cand = rank_window(tp, tokens, 7)
    monkeypatch.setenv("MMSPEC_KERNELS", "triton")
    got = group_sums(tokens, cand, tp, dp, emb, 0.01, 300.0)
    ref = group_sums_reference(tokens, cand, tp, dp, emb, 0.01, 300.0)
    assert torch.allclose(got[0], ref[0]) and torch.allclose(got[1], ref[1])
    assert (got[0] > tp.gather(1, tokens[:, None])[:, 0] + 1e-6).any(), "some groups must pool neighbours"
    p_x, q_x = group_sums(tokens, rank_window(tp, tokens, 0), tp, dp, emb, 0.01, 300.0)
    assert torch.equal(p_x, tp.gather(1, tokens[:, None])[:, 0]) and torch.equal(q_x, dp.gather(1, tokens[:, None])[:, 0])


def test_grouped_acceptance_pools_and_resamples_from_the_residual(torch_kernels):
    """x = 2 with p(x) = 0.10, q(x) = 0.6. Group (rank half-width 2, gap 0.1): {2, 4, 0} with
    Σp = 0.30, Σq = 0.8, so accept with 0.375 instead of p/q = 0.167; a rejection draws from max(p − q, 0)."""
    n, vocab = 4000, 5
    target = torch.tensor([0.05, 0.40, 0.10, 0.30, 0.15]).expand(n, 2, vocab)
    draft = Draft(tokens=torch.full((n, 1), 2), probs=torch.tensor([0.1, 0.1, 0.6, 0.1, 0.1]).expand(n, 1, vocab))
    emb = torch.zeros(vocab, 3)
    grouped = GroupedAcceptance(emb, group_size=2, prob_gap=0.1, dist_threshold=1.0)
    acc = grouped(draft, target, torch.Generator().manual_seed(0))
    assert abs(acc.num_accepted.float().mean() - 0.375) < 0.03
    rejected = acc.tokens[acc.num_accepted == 0, 0]
    assert set(rejected.tolist()) <= {1, 3, 4} and len(set(rejected.tolist())) == 3
    single = GroupedAcceptance(emb, group_size=0, prob_gap=0.1, dist_threshold=1.0)
    assert abs(single(draft, target, torch.Generator().manual_seed(0)).num_accepted.float().mean() - 0.1 / 0.6) < 0.03
    far = GroupedAcceptance(torch.arange(vocab, dtype=torch.float)[:, None] * 10, 2, 0.1, 1.0)  # nobody is near
    assert abs(far(draft, target, torch.Generator().manual_seed(0)).num_accepted.float().mean() - 0.1 / 0.6) < 0.03


# --------------------------------------------------------------------------
# Decoding: greedy identity, output law, batches
# --------------------------------------------------------------------------

def jacobi_decoder(model, logits, window=WINDOW, init="random", coupling="independent", rule=None, grid_width=None):
    target = model if isinstance(model, ARModel) else HFCausalLM(model)
    drafter = JacobiDrafter(target.vocab_size, window, init=init, coupling=coupling, grid_width=grid_width)
    rule = rule or SpeculativeSampling()
    return SpeculativeDecoder(target, drafter, rule, logits, num_draft_tokens=window)


@pytest.fixture(scope="module")
def text_model():
    return tiny_llama(vocab_size=48, layers=2, seed=3)


@pytest.mark.parametrize("init,coupling", [("random", "independent"), ("repeat_horizon", "maximal"),
                                           ("sample_horizon", "gumbel"), ("vertical", "independent")])
def test_greedy_jacobi_equals_ar_ragged_batch(text_model, init, coupling, torch_kernels):
    from mmspec.common.accept import GreedyMatch

    ids = torch.tensor([[0, 5, 9, 3], [0, 0, 7, 1], [4, 4, 4, 4]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1]])
    logits = LogitsPipeline(temperature=0)
    ar = SpeculativeDecoder(HFCausalLM(text_model), logits=logits).generate(ids, mask, max_new_tokens=30)
    out = jacobi_decoder(text_model, logits, window=5, init=init, coupling=coupling, rule=GreedyMatch(),
                         grid_width=6).generate(ids, mask, max_new_tokens=30)
    assert torch.equal(out.sequences, ar.sequences)
    assert out.stats.row_steps < ar.stats.row_steps


@pytest.fixture(scope="module")
def small_model():
    return sharpened_tiny_lm(VOCAB)


def exact_law(model, logits):
    return exact_prompt_law(model, logits, PROMPT, NEW_TOKENS)


def law_pvalue(decoder, law, seed=0):
    return prompt_law_pvalue(decoder, law, PROMPT, VOCAB, NEW_TOKENS, SAMPLES, seed)


class StaleDraftProbs(JacobiDrafter):
    """Planted bug: tests a coupled draft against the distribution before the coupling (the code quirk the
    spec notes for MC-SJD), i.e. the wrong q."""

    def commit(self, ctx, acceptance, target_probs=None, output=None):
        old = self.draft_probs
        super().commit(ctx, acceptance, target_probs)
        batch, k = self.drafts.shape
        src = (torch.arange(k)[None, :] + acceptance.num_accepted[:, None] + 1).clamp(max=k - 1)
        stale = old.gather(1, src[..., None].expand(-1, -1, old.shape[-1]))
        carried = (torch.arange(k)[None, :] + acceptance.num_accepted[:, None] + 1) < k
        self.draft_probs = torch.where(carried[..., None], stale, self.draft_probs)


LAW_CASES = [("random", "independent"), ("repeat_horizon", "independent"), ("sample_horizon", "independent"),
             ("random", "maximal"), ("vertical", "maximal"), ("random", "gumbel")]


@pytest.mark.parametrize("init,coupling", LAW_CASES)
def test_sjd_and_mc_sjd_follow_the_target_law(small_model, init, coupling, torch_kernels):
    logits = LogitsPipeline(temperature=1.0)
    pvalue, stats = law_pvalue(jacobi_decoder(small_model, logits, init=init, coupling=coupling, grid_width=2),
                               exact_law(small_model, logits))
    assert pvalue > 1e-3
    assert 1.2 < stats.mean_accepted < NEW_TOKENS  # drafts are both accepted and rejected


def test_top_k_law(small_model, torch_kernels):
    logits = LogitsPipeline(temperature=0.8, top_k=2)
    pvalue, _ = law_pvalue(jacobi_decoder(small_model, logits, coupling="maximal"), exact_law(small_model, logits))
    assert pvalue > 1e-3


@pytest.mark.parametrize("bug", ["no-residual", "stale-q"])
def test_planted_bugs_fail_the_law_test(small_model, bug, torch_kernels):
    logits = LogitsPipeline(temperature=1.0)
    if bug == "no-residual":
        decoder = jacobi_decoder(small_model, logits, rule=ResidualFromTarget())
    else:
        decoder = jacobi_decoder(small_model, logits, coupling="maximal")
        decoder.drafter = StaleDraftProbs(VOCAB, WINDOW, coupling="maximal")
    pvalue, _ = law_pvalue(decoder, exact_law(small_model, logits))
    assert pvalue < 1e-6


@pytest.mark.parametrize("coupling", ["maximal", "gumbel", "independent"])
def test_mc_sjd_keeps_every_draft_when_distributions_do_not_change(coupling, torch_kernels):
    """Two verify passes with the same distributions and a rejection at the first slot each time: every
    coupled draft stays what it was (it moves one slot left); SJD's independent redraws change them."""
    vocab, window, rows = 16, 6, 8
    probs = torch.randn(rows, 1, vocab, generator=torch.Generator().manual_seed(0)).softmax(-1)
    probs = probs.expand(rows, window + 1, vocab)
    drafter = JacobiDrafter(vocab, window, coupling=coupling)
    drafter.begin(None, None)
    ctx = type("Ctx", (), {})()
    ctx.last_tokens, ctx.positions = torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.long)
    ctx.logits, ctx.generator = LogitsPipeline(temperature=1.0), torch.Generator().manual_seed(1)
    drafter.propose(ctx)
    reject_first = Acceptance(torch.zeros(rows, dtype=torch.long), torch.zeros(rows, window + 1, dtype=torch.long))
    drafter.commit(ctx, reject_first, probs)  # now every draft is a sample from probs
    before = drafter.drafts.clone()
    drafter.commit(ctx, reject_first, probs)
    unchanged = drafter.drafts[:, : window - 1] == before[:, 1:]
    if coupling == "independent":
        assert not unchanged.all()
    else:
        assert unchanged.all()


@pytest.fixture(scope="module")
def sharp_model():
    model = tiny_llama(vocab_size=48, layers=2, seed=4)
    with torch.no_grad():  # peaked distributions, as an image model's: random drafts are mostly rejected
        model.lm_head.weight.mul_(10.0)
    return model


def test_gsd_with_group_size_zero_is_sjd(sharp_model, torch_kernels):
    ids = torch.tensor([[0, 5, 9], [3, 3, 1]])
    logits = LogitsPipeline(temperature=1.0)
    text_model = sharp_model
    emb = HFCausalLM(text_model).token_embeddings()
    gens = lambda: [torch.Generator().manual_seed(s) for s in (5, 6)]  # noqa: E731
    sjd = jacobi_decoder(text_model, logits, window=4).generate(ids, max_new_tokens=60, generator=gens())
    gsd = jacobi_decoder(text_model, logits, window=4, rule=GroupedAcceptance(emb, 0, 0.15, math.inf)) \
        .generate(ids, max_new_tokens=60, generator=gens())
    assert torch.equal(sjd.sequences, gsd.sequences)
    grouped = jacobi_decoder(text_model, logits, window=4, rule=GroupedAcceptance(emb, 7, 0.5, math.inf)) \
        .generate(ids, max_new_tokens=60, generator=gens())
    assert grouped.stats.mean_accepted > sjd.stats.mean_accepted


@pytest.mark.parametrize("coupling", ["independent", "maximal", "gumbel"])
def test_rows_do_not_depend_on_their_batch(text_model, coupling, torch_kernels):
    ids = torch.tensor([[0, 5, 9], [3, 3, 1], [7, 2, 2]])
    logits = LogitsPipeline(temperature=1.0, top_k=20)
    decoder = jacobi_decoder(text_model, logits, window=4, init="repeat_horizon", coupling=coupling)
    steps = []
    batch = decoder.generate(ids, max_new_tokens=20, generator=[torch.Generator().manual_seed(s) for s in range(3)],
                             callback=lambda step, info: steps.append(info["num_accepted"].tolist()))
    for row in range(3):
        alone = decoder.generate(ids[row:row + 1], max_new_tokens=20, generator=[torch.Generator().manual_seed(row)])
        assert torch.equal(alone.sequences[0], batch.sequences[row])
    assert any(len(set(n)) > 1 for n in steps), "acceptance should be ragged across rows"


def test_vertical_init_copies_the_row_above(torch_kernels):
    drafter = JacobiDrafter(vocab_size=10, window=3, init="vertical", grid_width=4)
    drafter.begin(None, None)
    ctx = type("Ctx", (), {})()
    ctx.last_tokens, ctx.positions, ctx.generator = torch.tensor([10]), torch.tensor([0]), None
    ctx.logits = LogitsPipeline(temperature=1.0)
    first = drafter.propose(ctx)
    assert first.probs[0, 0].sum() == pytest.approx(1.0)  # the class token cannot be copied: random, q = 1/V
    # Commit 5 tokens: 1 2 3 4 | 5 (grid width 4): the tail slots copy the tokens above them.
    tokens = torch.tensor([[1, 2, 3, 4]])
    drafter.drafts = tokens[:, :3].clone()
    acc = Acceptance(torch.tensor([3]), torch.tensor([[1, 2, 3, 9]]))
    drafter.commit(ctx, acc, torch.full((1, 4, 10), 0.1))
    # history: 1 2 3 9; the window is generated indices 4, 5, 6 -> above: 0, 1, 2 -> 1 2 3
    assert drafter.drafts.tolist() == [[1, 2, 3]]
    assert torch.equal(drafter.draft_probs[0, 1], torch.nn.functional.one_hot(torch.tensor(2), 10).float())


# --------------------------------------------------------------------------
# Plugins: registry, pipelines, bad inputs
# --------------------------------------------------------------------------

def test_plugins_are_registered():
    assert get_plugin_class("sjd").lossless and get_plugin_class("mc_sjd").lossless
    assert not get_plugin_class("gsd").lossless
    assert get_plugin_class("gsd")().config.group_size == 7


@pytest.mark.parametrize("name,kwargs,match", [
    ("sjd", {"window": 0}, "window"), ("sjd", {"init": "diagonal"}, "init"),
    ("mc_sjd", {"coupling": "exact"}, "coupling"), ("gsd", {"group_size": -1}, "group_size"),
    ("gsd", {"prob_gap": 0.0}, "prob_gap"), ("gsd", {"embed_threshold": -1.0}, "embed_threshold"),
])
def test_bad_config(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_plugin_class(name)(**kwargs)


def test_bad_drafter_arguments():
    with pytest.raises(ValueError, match="window"):
        JacobiDrafter(10, 2.5)
    with pytest.raises(ValueError, match="grid"):
        JacobiDrafter(10, 4, init="vertical")


@pytest.fixture(scope="module")
def janus_pipe():
    pipe = ARImagePipeline(build_tiny_janus(), tokenizer=tiny_text_tokenizer(boi_token="<begin_of_image>"))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("name,config", [("sjd", {"window": 5, "init": "vertical"}),
                                         ("mc_sjd", {"window": 5, "coupling": "gumbel"}),
                                         ("gsd", {"window": 5})])
def test_plugins_on_janus(janus_pipe, name, config, torch_kernels):
    prompts = ["a b", "c"]
    ar = janus_pipe(prompt=prompts, guidance_scale=2.0, temperature=0, output_type="pt")
    plugin_pipe = get_plugin_class(name)(**config).attach(janus_pipe)
    greedy = plugin_pipe(prompt=prompts, guidance_scale=2.0, temperature=0, output_type="pt")
    assert torch.equal(greedy.tokens, ar.tokens)
    assert greedy.stats.target_nfe < HF_GRID * HF_GRID
    gens = lambda: [torch.Generator().manual_seed(s) for s in (1, 2)]  # noqa: E731
    sampled = plugin_pipe(prompt=prompts, guidance_scale=2.0, generator=gens(), output_type="pt")
    again = plugin_pipe(prompt=prompts[1:], guidance_scale=2.0, generator=gens()[1:], output_type="pt")
    assert torch.equal(sampled.tokens[1:], again.tokens)
    assert sampled.images.shape[0] == 2
