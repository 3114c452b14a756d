"""`eagle`, `lantern`, `lantern++`: the pooling kernel, the relaxed law and its bound, δ = 0 / λ = 1 equal to
strict speculative decoding, greedy identity with AR, the output law of `eagle`, ragged batches, the HF
adapters, the bundled head, bad inputs."""


import pytest
import torch
from law import (
    ResidualFromTarget, exact_prompt_law, gof_pvalue, prompt_law_pvalue, sharpened_tiny_lm,
)
from tiny_models import (
    build_tiny_chameleon, build_tiny_emu3, build_tiny_janus, tiny_llama, tiny_text_tokenizer,
)

from mmspec.common.accept import Draft, GreedyMatch, SpeculativeSampling
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import HFCausalLM
from mmspec.common.loading import load_plugin
from mmspec.common.registry import get_plugin_class
from mmspec.common.tree import TreeSpec, parse_branching
from mmspec.plugins.lantern import (
    BoundHead, EagleDrafter, EagleHead, RelaxedAcceptance, codebook_neighbours, pooled_probability,
)
from mmspec.plugins.lantern.kernels import pooled_probability_reference
from mmspec.plugins.lantern.training import distill_losses, teacher_pass
from mmspec.vision.pipeline import ARImagePipeline


def random_probs(n, vocab, seed, sharp=3.0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, vocab, generator=g) ** sharp
    return p / p.sum(1, keepdim=True)


def relaxed_target(p, x, neighbours, count, pooled):
    """p^x built from scratch: the first `count` neighbours' mass moved onto x."""
    out = p.clone()
    out[neighbours[x, :count]] = 0.0
    out[x] = pooled
    return out


# --------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------

def test_pooled_probability_by_hand():
    p = torch.tensor([[0.30, 0.05, 0.20, 0.10, 0.35]])
    neighbours = torch.tensor([[1, 3, 2, 4]] * 5)  # code 0's nearest: 1, then 3, then 2, then 4
    x = torch.tensor([0])
    pooled, count = pooled_probability_reference(x, neighbours, p, 0.16, None)  # 0.05 + 0.10 = 0.15 <= 0.16
    assert count.item() == 2 and pooled.item() == pytest.approx(0.45)
    pooled, count = pooled_probability_reference(x, neighbours, p, None, 1.5)  # cap (1.5 - 1) * 0.30 = 0.15
    assert count.item() == 2 and pooled.item() == pytest.approx(0.45)
    pooled, count = pooled_probability_reference(x, neighbours, p, 0.0, None)
    assert count.item() == 0 and pooled.item() == pytest.approx(0.30)


@pytest.mark.parametrize("mode", ["delta", "lam"])
def test_pooled_probability_triton_matches_reference(monkeypatch, mode):
    monkeypatch.setenv("MMSPEC_KERNELS", "triton")
    vocab, k, n = 40, 7, 33
    codebook = torch.randn(vocab, 4, generator=torch.Generator().manual_seed(0))
    neighbours = codebook_neighbours(codebook, k)
    probs = random_probs(n, vocab, 1)
    tokens = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(2))
    kwargs = {"delta": 0.12} if mode == "delta" else {"lam": 3.0}
    pooled, count = pooled_probability(tokens, neighbours, probs, **kwargs)
    ref_pooled, ref_count = pooled_probability_reference(tokens, neighbours, probs, kwargs.get("delta"),
                                                         kwargs.get("lam"))
    assert torch.equal(count, ref_count)
    assert torch.allclose(pooled, ref_pooled, atol=1e-6)
    assert (count > 0).any() and (count < k).any()  # the bound binds somewhere and lets mass in elsewhere


def test_codebook_neighbours_nearest_first_ties_by_id():
    codebook = torch.tensor([[0.0], [1.0], [-1.0], [3.0], [0.5]])
    table = codebook_neighbours(codebook, 4)
    assert table[0].tolist() == [4, 1, 2, 3]  # 0.5, then 1 and -1 tie (id order), then 3
    assert table[3].tolist() == [1, 4, 0, 2]
    for bad in (0, 5, 2.0):
        with pytest.raises(ValueError, match="k must be"):
            codebook_neighbours(codebook, bad)


# --------------------------------------------------------------------------
# The rule
# --------------------------------------------------------------------------

def chain_case(batch=64, k=4, vocab=30, seed=0, deterministic=False):
    g = torch.Generator().manual_seed(seed)
    target = random_probs(batch * (k + 1), vocab, seed).view(batch, k + 1, vocab)
    draft_probs = random_probs(batch * k, vocab, seed + 1).view(batch, k, vocab)
    tokens = torch.multinomial(draft_probs.view(-1, vocab), 1, generator=g).view(batch, k)
    return Draft(tokens=tokens, probs=None if deterministic else draft_probs), target


@pytest.mark.parametrize("bound", [{"delta": 0.0}, {"lam": 1.0}])
@pytest.mark.parametrize("deterministic", [False, True])
def test_no_relaxation_is_speculative_sampling(bound, deterministic, torch_kernels):
    draft, target = chain_case(deterministic=deterministic)
    neighbours = codebook_neighbours(torch.randn(30, 3, generator=torch.Generator().manual_seed(5)), 8)
    strict = SpeculativeSampling()(draft, target, torch.Generator().manual_seed(9))
    relaxed = RelaxedAcceptance(neighbours, **bound)(draft, target, torch.Generator().manual_seed(9))
    assert torch.equal(strict.num_accepted, relaxed.num_accepted)
    assert torch.equal(strict.tokens, relaxed.tokens)
    assert (strict.num_accepted > 0).any() and (strict.num_accepted < 4).any()


def test_acceptance_rises_with_delta(torch_kernels):
    draft, target = chain_case(batch=2000)
    neighbours = codebook_neighbours(torch.randn(30, 3, generator=torch.Generator().manual_seed(5)), 16)
    kept = [RelaxedAcceptance(neighbours, delta=d)(draft, target, torch.Generator().manual_seed(3))
            .num_accepted.float().mean().item() for d in (0.0, 0.1, 0.3)]
    assert kept[0] < kept[1] < kept[2]


class OverZeroing(RelaxedAcceptance):
    """Planted bug: the public code's quirk, zeroing all k nearest neighbours of x on a rejection whenever any
    was pooled, instead of the J it pooled."""

    def _pool(self, tokens, probs):
        pooled, count, merged = super()._pool(tokens, probs)
        everything = self.neighbours.to(probs.device)[tokens]
        return pooled, count, torch.where((count > 0)[:, None], everything, merged)


@pytest.mark.parametrize("rule,delta", [(RelaxedAcceptance, 0.15), (RelaxedAcceptance, 0.4), (OverZeroing, 0.15)])
def test_emitted_token_follows_the_relaxed_target(rule, delta, torch_kernels):
    """One fixed deterministic draft x against one target row, 60 000 times: the emitted token must follow
    p^x exactly (accept + relaxed residual), and p^x is within δ of p."""
    vocab, rows, k = 12, 60_000, 6
    p = random_probs(1, vocab, 7, sharp=1.0)[0]
    neighbours = codebook_neighbours(torch.randn(vocab, 2, generator=torch.Generator().manual_seed(1)), k)
    x = int(p.argsort()[vocab // 2])  # a middling token: some pooling, frequent rejections
    draft = Draft(tokens=torch.full((rows, 1), x), probs=None)
    target = p.expand(rows, 2, vocab).contiguous()
    acc = rule(neighbours, delta=delta)(draft, target, torch.Generator().manual_seed(0))
    emitted = acc.tokens[:, 0]
    pooled, count = pooled_probability_reference(torch.tensor([x]), neighbours, p[None], delta, None)
    law = relaxed_target(p, x, neighbours, int(count), float(pooled))
    assert 0 < int(count)
    assert 0.5 * (law - p).abs().sum().item() <= delta + 1e-6
    counts = torch.bincount(emitted, minlength=vocab)
    pvalue = gof_pvalue(counts, law)
    if rule is OverZeroing:
        assert pvalue < 1e-6
    else:
        assert pvalue > 1e-3
        assert counts[law == 0].sum() == 0  # the merged neighbours are never emitted


@pytest.mark.parametrize("bound", [{"delta": 0.2}, {"lam": 4.0}])
def test_every_tested_draft_respects_the_bound(bound, torch_kernels):
    """Sampled drafts, a whole chain: for every draft the rule tested, the relaxed target it tested against
    is within δ of p in total variation (LANTERN), or never more than λ·p(x) at x (LANTERN++)."""
    draft, target = chain_case(batch=500, k=4)
    neighbours = codebook_neighbours(torch.randn(30, 3, generator=torch.Generator().manual_seed(5)), 12)
    rule = RelaxedAcceptance(neighbours, record=True, **bound)
    rule(draft, target, torch.Generator().manual_seed(1))
    rec = rule.records[0]
    assert rec["count"].sum() > 0 and rec["accepted"].any() and (~rec["accepted"]).any()
    for x, p, pooled, count in zip(rec["tokens"], rec["target"], rec["pooled"], rec["count"]):
        relaxed = relaxed_target(p, int(x), neighbours, int(count), float(pooled))
        assert relaxed.sum().item() == pytest.approx(1.0, abs=1e-5)
        if "delta" in bound:
            assert 0.5 * (relaxed - p).abs().sum().item() <= bound["delta"] + 1e-6
        else:
            assert pooled.item() <= bound["lam"] * p[x].item() + 1e-6


def test_tree_tests_respect_the_cap(text_model, torch_kernels):
    """LANTERN++ on a static tree: every child tested against the (residual) target got p~(x) <= λ·p(x)."""
    model = text_model
    rule = RelaxedAcceptance(NEIGHBOURS_48, lam=3.0, record=True)
    eagle_decoder(model, LogitsPipeline(temperature=1.0), rule=rule, tree=TREE).generate(
        torch.tensor([[0, 5, 9], [3, 3, 1]]), max_new_tokens=20, generator=torch.Generator().manual_seed(0))
    pooled = torch.cat([r["pooled"] for r in rule.records])
    p_x = torch.cat([r["target"].gather(1, r["tokens"][:, None])[:, 0] for r in rule.records])
    counts = torch.cat([r["count"] for r in rule.records])
    assert (counts > 0).any()
    assert (pooled <= 3.0 * p_x + 1e-6).all()


def test_greedy_relaxed_keeps_a_draft_whose_pooled_mass_wins():
    p = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10])
    neighbours = torch.tensor([[4], [3], [1], [1], [0]])  # code 1's nearest is 3: 0.25 + 0.15 > 0.30
    draft = Draft(tokens=torch.tensor([[1]]))
    target = p.expand(1, 2, 5)
    assert RelaxedAcceptance(neighbours, delta=0.2, greedy=True)(draft, target).tokens[0, 0].item() == 1
    assert RelaxedAcceptance(neighbours, delta=0.1, greedy=True)(draft, target).tokens[0].tolist() == [0, -1]
    assert RelaxedAcceptance(neighbours, lam=1.5, greedy=True)(draft, target).tokens[0].tolist() == [0, -1]


def test_bad_rule_arguments():
    table = torch.zeros(5, 2, dtype=torch.long)
    for kwargs, match in (({"delta": 1.5}, "delta"), ({"delta": -0.1}, "delta"), ({"lam": 0.5}, "lam"),
                          ({}, "exactly one"), ({"delta": 0.1, "lam": 2.0}, "exactly one")):
        with pytest.raises(ValueError, match=match):
            RelaxedAcceptance(table, **kwargs)
    rule = RelaxedAcceptance(table, delta=0.1)
    with pytest.raises(ValueError, match="neighbour table covers 5 codes"):
        rule(Draft(tokens=torch.zeros(1, 1, dtype=torch.long)), torch.full((1, 2, 6), 1 / 6))


# --------------------------------------------------------------------------
# The drafter and the decode loop (tiny text models: the EAGLE machinery is modality-free)
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def text_model():
    return tiny_llama(vocab_size=48, layers=2, seed=3)


def distilled_head(model, steps=150, seed=0):
    """A head trained briefly on sequences the model samples itself (the training module's losses), so its
    drafts are often but not always right: ragged acceptance."""
    target = HFCausalLM(model)
    torch.manual_seed(seed)
    head = EagleHead.for_target(target)
    bound = BoundHead(head, target)
    start = torch.randint(0, model.config.vocab_size, (128, 1), generator=torch.Generator().manual_seed(seed))
    ids = torch.cat([start, SpeculativeDecoder(target, logits=LogitsPipeline(temperature=0.7)).generate(
        start, max_new_tokens=40, generator=torch.Generator().manual_seed(seed)).sequences], 1)
    feats, probs = teacher_pass(target, ids)
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    for _ in range(steps):
        feat_loss, token_loss, *_ = distill_losses(bound, ids, feats, probs, noise=0.0)
        opt.zero_grad()
        (feat_loss + token_loss).backward()
        opt.step()
    return head.eval()


_HEADS = {}


def eagle_decoder(model, logits, rule=None, tree=None, k=3, seed=0, trained=True, sampled_children=False,
                  drafter_class=EagleDrafter):
    """tree: None (a chain of k), a TreeSpec, or a `Dynamic` (EAGLE-2 trees grown per row and step)."""
    target = HFCausalLM(model)
    if trained:
        if id(model) not in _HEADS:
            _HEADS[id(model)] = distilled_head(model)
        head = _HEADS[id(model)]
    else:
        torch.manual_seed(seed)
        head = EagleHead.for_target(target)
    rule = rule or (GreedyMatch() if logits.greedy else SpeculativeSampling())
    dynamic = tree.settings if isinstance(tree, Dynamic) else None
    static = None if dynamic is not None else tree
    drafter = drafter_class(head, target, tree=static, dynamic=dynamic, sampled_children=sampled_children)
    return SpeculativeDecoder(target, drafter, rule, logits, num_draft_tokens=0 if tree is not None else k)


class Dynamic:
    def __init__(self, depth, top_k, total_tokens):
        self.settings = (depth, top_k, total_tokens)

    def __repr__(self):
        return f"Dynamic{self.settings}"


TREE = TreeSpec.full([3, 2, 1])
UNEVEN = parse_branching("0;1;2;0.0;0.1;1.0;0.0.0")  # a planned shape: leaves at inner depths get no head forward
DYNAMIC = Dynamic(4, 3, 9)
NEIGHBOURS_48 = codebook_neighbours(torch.randn(48, 4, generator=torch.Generator().manual_seed(0)), 10)


@pytest.mark.parametrize("tree,rule", [(None, "strict"), (TREE, "strict"), (UNEVEN, "strict"), (None, "delta0"),
                                       (TREE, "lam1"),
                                       (None, "delta"), (TREE, "lam"), (DYNAMIC, "strict"), (DYNAMIC, "lam1")])
def test_greedy_equals_ar_ragged_batch(text_model, tree, rule, torch_kernels):
    """Strict rules, and relaxed ones with no relaxation, reproduce AR exactly; a real relaxation may not."""
    ids = torch.tensor([[0, 5, 9, 3], [0, 0, 7, 1], [4, 4, 4, 4]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1]])
    logits = LogitsPipeline(temperature=0)
    ar = SpeculativeDecoder(HFCausalLM(text_model), logits=logits).generate(ids, mask, max_new_tokens=40)
    chosen = {"strict": None, "delta0": RelaxedAcceptance(NEIGHBOURS_48, delta=0.0, greedy=True),
              "lam1": RelaxedAcceptance(NEIGHBOURS_48, lam=1.0, greedy=True),
              "delta": RelaxedAcceptance(NEIGHBOURS_48, delta=0.5, greedy=True),
              "lam": RelaxedAcceptance(NEIGHBOURS_48, lam=50.0, greedy=True)}[rule]
    out = eagle_decoder(text_model, logits, rule=chosen, tree=tree).generate(ids, mask, max_new_tokens=40)
    if rule in ("delta", "lam"):
        assert out.stats.mean_accepted >= eagle_decoder(text_model, logits, tree=tree).generate(
            ids, mask, max_new_tokens=40).stats.mean_accepted
        return
    assert torch.equal(out.sequences, ar.sequences)
    assert out.stats.row_steps < 0.7 * ar.stats.row_steps  # drafts are kept often


def test_tree_drafting_runs_the_head_only_on_nodes_with_children(text_model, torch_kernels):
    """UNEVEN's depth 1 has three nodes of which two have children, its depth 2 three with one: the head's
    tree forwards feed 2 then 1 tokens per row (a leaf's own prediction is never read)."""
    decoder = eagle_decoder(text_model, LogitsPipeline(temperature=0), tree=UNEVEN)
    widths, run = [], decoder.drafter.bound.run

    def counting_run(state, tokens, *args, tree=None, **kwargs):
        if tree is not None:
            widths.append(tokens.shape[1])
        return run(state, tokens, *args, tree=tree, **kwargs)

    decoder.drafter.bound.run = counting_run
    out = decoder.generate(torch.tensor([[0, 5, 9, 3]]), max_new_tokens=12)
    assert widths and widths == [2, 1] * (len(widths) // 2)
    assert len(widths) // 2 == out.stats.target_nfe


VOCAB, NEW_TOKENS, SAMPLES = 4, 4, 30_000
PROMPT = [1, 2]


@pytest.fixture(scope="module")
def small_model():
    return sharpened_tiny_lm(VOCAB)


def exact_law(model, logits):
    return exact_prompt_law(model, logits, PROMPT, NEW_TOKENS)


def law_pvalue(decoder, law, seed=0):
    return prompt_law_pvalue(decoder, law, PROMPT, VOCAB, NEW_TOKENS, SAMPLES, seed)


SMALL_NEIGHBOURS = torch.tensor([[1, 2], [0, 2], [3, 1], [2, 0]])


@pytest.mark.parametrize("tree,rule", [(None, None), (TreeSpec.full([2, 1]), None),
                                       (None, RelaxedAcceptance(SMALL_NEIGHBOURS, delta=0.0)),
                                       (TreeSpec.full([2, 1]), RelaxedAcceptance(SMALL_NEIGHBOURS, lam=1.0)),
                                       (Dynamic(3, 2, 5), None),
                                       (Dynamic(3, 2, 5), RelaxedAcceptance(SMALL_NEIGHBOURS, lam=1.0))])
def test_eagle_sampling_follows_the_target_law(small_model, tree, rule, torch_kernels):
    logits = LogitsPipeline(temperature=1.0)
    pvalue, stats = law_pvalue(eagle_decoder(small_model, logits, rule=rule, tree=tree, k=2, trained=False),
                               exact_law(small_model, logits))
    assert pvalue > 1e-3
    assert 1.1 < stats.mean_accepted  # drafts are kept


class ArgmaxFirstChildren(EagleDrafter):
    """A planted bug: each node's first child is its draft distribution's argmax, yet the draft still says it was
    sampled from that distribution."""

    def _propose_tree(self, ctx, root):
        draft = super()._propose_tree(ctx, root)
        tree = draft.tree
        for node in range(1, tree.num_nodes + 1):
            if tree.ranks[node] == 0:
                draft.tokens[:, node - 1] = draft.probs[:, tree.parents[node]].argmax(-1)
        return draft


@pytest.mark.parametrize("branching", ["2,1", "3,2", "0;1;0.0;0.0.0"])
def test_trees_with_sampled_first_children_follow_the_target_law(small_model, branching, torch_kernels):
    """eagle's sampled trees: each node's first child drawn from the head, kept with min(1, p/q), the residual
    max(0, p - q) left to its top-ranked siblings. Exact in law; first children not drawn from q are caught."""
    logits = LogitsPipeline(temperature=1.0)
    law = exact_law(small_model, logits)
    pvalue, stats = law_pvalue(eagle_decoder(small_model, logits, tree=parse_branching(branching), trained=False,
                                             sampled_children=True), law)
    assert pvalue > 1e-3 and stats.mean_accepted > 1.1
    bugged, _ = law_pvalue(eagle_decoder(small_model, logits, tree=parse_branching(branching), trained=False,
                                         sampled_children=True, drafter_class=ArgmaxFirstChildren), law)
    assert bugged < 1e-6


@pytest.mark.parametrize("rule", ["residual-bug", "relaxed"])
def test_law_test_catches_a_wrong_law(small_model, rule, torch_kernels):
    """The same test fails a planted residual bug, and a real relaxation (which is meant to change the law)."""
    logits = LogitsPipeline(temperature=1.0)
    chosen = ResidualFromTarget() if rule == "residual-bug" else RelaxedAcceptance(SMALL_NEIGHBOURS, delta=0.3)
    pvalue, _ = law_pvalue(eagle_decoder(small_model, logits, rule=chosen, k=2, trained=False),
                           exact_law(small_model, logits))
    assert pvalue < 1e-6


@pytest.mark.parametrize("tree,rule", [(None, "lantern"), (TREE, "lantern++"), (None, "eagle"), (DYNAMIC, "eagle"),
                                       (DYNAMIC, "lantern++")])
def test_rows_do_not_depend_on_their_batch(text_model, tree, rule, torch_kernels):
    ids = torch.tensor([[0, 5, 9], [3, 3, 1], [7, 2, 2]])
    logits = LogitsPipeline(temperature=1.0, top_k=20)

    def make():
        chosen = {"lantern": RelaxedAcceptance(NEIGHBOURS_48, delta=0.2),
                  "lantern++": RelaxedAcceptance(NEIGHBOURS_48, lam=3.0), "eagle": None}[rule]
        return eagle_decoder(text_model, logits, rule=chosen, tree=tree)

    gens = lambda seeds: [torch.Generator().manual_seed(s) for s in seeds]  # noqa: E731
    together = make().generate(ids, max_new_tokens=30, generator=gens([1, 2, 3]))
    for row in range(3):
        alone = make().generate(ids[row:row + 1], max_new_tokens=30, generator=gens([row + 1]))
        assert torch.equal(together.sequences[row], alone.sequences[0])
    again = make().generate(ids, max_new_tokens=30, generator=gens([1, 2, 3]))
    assert torch.equal(together.sequences, again.sequences)


def test_head_and_target_must_agree(text_model):
    target = HFCausalLM(text_model)
    with pytest.raises(ValueError, match="vocabulary"):
        BoundHead(EagleHead(hidden_size=32, num_heads=4, vocab_size=47), target)
    with pytest.raises(ValueError, match="hidden size"):
        BoundHead(EagleHead(hidden_size=64, num_heads=4, vocab_size=48), target)
    with pytest.raises(ValueError, match="hidden_size / num_heads"):
        EagleHead(hidden_size=30, num_heads=4)


# --------------------------------------------------------------------------
# Plugins on the HF image adapters and on the bundled model
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def janus_setup(tmp_path_factory):
    pipe = ARImagePipeline(build_tiny_janus(), tokenizer=tiny_text_tokenizer(boi_token="<begin_of_image>"))
    pipe.set_progress_bar_config(disable=True)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("janus_head")
    EagleHead.for_target(pipe.target_adapter()).save_pretrained(path)
    return pipe, str(path)


@pytest.mark.parametrize("name,config", [("eagle", {}), ("eagle", {"tree_branching": "2,2"}),
                                         ("lantern", {"k": 4, "delta": 0.0}), ("lantern++", {"k": 3, "lam": 1.0}),
                                         ("eagle", {"tree_depth": 3, "tree_top_k": 2, "tree_total_tokens": 5})])
def test_plugins_on_janus(janus_setup, name, config, torch_kernels):
    pipe, head = janus_setup
    prompts = ["a b", "c"]
    ar = pipe(prompt=prompts, guidance_scale=2.0, temperature=0, output_type="pt")
    plugin_pipe = get_plugin_class(name)(head_path=head, **config).attach(pipe)
    greedy = plugin_pipe(prompt=prompts, guidance_scale=2.0, temperature=0, output_type="pt")
    assert torch.equal(greedy.tokens, ar.tokens)  # no relaxation: AR exactly
    gens = lambda: [torch.Generator().manual_seed(s) for s in (1, 2)]  # noqa: E731
    sampled = plugin_pipe(prompt=prompts, guidance_scale=2.0, generator=gens(), output_type="pt")
    again = plugin_pipe(prompt=prompts[1:], guidance_scale=2.0, generator=gens()[1:], output_type="pt")
    assert torch.equal(sampled.tokens[1:], again.tokens)


@pytest.mark.parametrize("build", [build_tiny_emu3, build_tiny_chameleon])
def test_untrained_head_drafts_for_emu3_and_chameleon(build, torch_kernels):
    from mmspec.vision.hf_adapters import ChameleonImageAdapter, Emu3ImageAdapter

    model = build()
    target = Emu3ImageAdapter(model, width=4) if build is build_tiny_emu3 else ChameleonImageAdapter(model)
    head = EagleHead.for_target(target)
    prompt = target.prompt_ids(torch.tensor([[1, 5, 6, 7], [1, 9, 9, 8]]))
    logits = LogitsPipeline(temperature=0)
    ar = SpeculativeDecoder(target, logits=logits).generate(prompt, max_new_tokens=16)
    out = SpeculativeDecoder(target, EagleDrafter(head, target), GreedyMatch(), logits,
                             num_draft_tokens=3).generate(prompt, max_new_tokens=16)
    assert torch.equal(out.sequences, ar.sequences)


def test_bad_plugin_config(janus_setup):
    pipe, head = janus_setup
    for name, kwargs, match in (("lantern", {"delta": 1.5}, "delta"), ("lantern", {"k": 0}, "k"),
                                ("lantern++", {"lam": 0.5}, "lam"), ("lantern++", {"tree_branching": ""}, "tree"),
                                ("eagle", {"tree_branching": "2,x"}, "tree_branching"),
                                ("eagle", {"num_draft_tokens": 0}, "num_draft_tokens"),
                                ("eagle", {"tree_depth": 3, "tree_branching": "2,2"}, "set tree_branching='' or"),
                                ("eagle", {"tree_depth": 3, "tree_top_k": 2, "tree_total_tokens": 11},
                                 "tree_total_tokens must be between 1 and .* = 10")):
        with pytest.raises(ValueError, match=match):
            get_plugin_class(name)(**kwargs)
    too_many = get_plugin_class("lantern")(head_path=head, k=24).attach(pipe)  # the tiny codebook has 24 codes
    with pytest.raises(ValueError, match="k must be at most the codebook size - 1 \\(23\\)"):
        too_many(prompt=["a"], guidance_scale=2.0, output_type="pt")
    with pytest.raises(ValueError, match="head_path '/nonexistent' is not a saved folder"):  # at load time
        get_plugin_class("lantern")(head_path="/nonexistent", k=4)


def test_bundled_head_drafts_for_the_bundled_model(torch_kernels):
    from mmspec.vision.pipeline import bundled_pipeline

    pipe = bundled_pipeline()
    pipe.set_progress_bar_config(disable=True)
    labels = [1, 6]
    ar = pipe(class_labels=labels, guidance_scale=3.0, temperature=0, output_type="pt")
    eagle_pipe = get_plugin_class("eagle")().attach(pipe)
    eagle = eagle_pipe(class_labels=labels, guidance_scale=3.0, temperature=0, output_type="pt")
    assert torch.equal(eagle.tokens, ar.tokens)
    assert eagle.stats.mean_accepted > 1.5  # a trained head: most first drafts are kept
    gens = lambda: [torch.Generator().manual_seed(s) for s in (3, 4)]  # noqa: E731
    lantern = get_plugin_class("lantern")(delta=0.2).attach(pipe)(class_labels=labels, guidance_scale=3.0,
                                                                   generator=gens(), output_type="pt")
    strict = eagle_pipe(class_labels=labels, guidance_scale=3.0, generator=gens(), output_type="pt")
    assert lantern.stats.mean_accepted > strict.stats.mean_accepted


@pytest.mark.parametrize("tree", [None, TREE, DYNAMIC])
def test_rows_leave_the_batch_at_their_own_eos(text_model, tree, torch_kernels):
    """Rows that hit EOS early leave the batch; the head's per-row state must follow (greedy == AR)."""
    ids = torch.tensor([[0, 5, 9, 3], [0, 0, 7, 1], [4, 4, 4, 4], [7, 8, 9, 10]])
    logits = LogitsPipeline(temperature=0)
    eos = 1  # row 1 emits it after 3 tokens, row 0 after 4; rows 2 and 3 never
    ar = SpeculativeDecoder(HFCausalLM(text_model), logits=logits, eos_token_id=eos).generate(ids, max_new_tokens=40)
    assert ar.lengths.tolist() == [4, 3, 40, 40]
    decoder = eagle_decoder(text_model, logits, tree=tree)
    decoder.eos_token_id = eos
    out = decoder.generate(ids, max_new_tokens=40)
    assert torch.equal(out.sequences, ar.sequences) and torch.equal(out.lengths, ar.lengths)


def test_lantern_beside_ar_and_saved_with_its_head(tmp_path, torch_kernels):
    """load_plugin leaves the AR pipeline as it was; a saved lantern pipeline reloads as lantern, head and
    settings included, and samples the same images for the same seeds."""
    from mmspec.vision.pipeline import ARImagePipeline, bundled_pipeline

    ar_pipe = bundled_pipeline()
    ar_pipe.set_progress_bar_config(disable=True)
    lantern = load_plugin("lantern", pipeline=ar_pipe, delta=0.2, k=16)
    assert ar_pipe.plugin is None and lantern.transformer is ar_pipe.transformer
    gens = lambda: [torch.Generator().manual_seed(s) for s in (5, 6)]  # noqa: E731
    ar = ar_pipe(class_labels=[2, 9], generator=gens(), output_type="pt")
    assert ar.stats.drafter_nfe == 0  # still plain AR
    before = lantern(class_labels=[2, 9], generator=gens(), output_type="pt")
    lantern.save_pretrained(tmp_path)
    loaded = ARImagePipeline.from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    assert loaded.plugin.name == "lantern" and (loaded.plugin.config.delta, loaded.plugin.config.k) == (0.2, 16)
    assert loaded.plugin.config.head_path == str(tmp_path / "eagle_head")
    after = loaded(class_labels=[2, 9], generator=gens(), output_type="pt")
    assert torch.equal(after.tokens, before.tokens) and after.stats.drafter_nfe > 0


@pytest.mark.train
def test_train_eagle_head_for_a_hf_model_resumes_to_identical_weights(tmp_path):
    """`train_eagle_head` (what `mmspec train-head` runs) on a tiny Janus: a run stopped at step 2 and resumed
    from its work folder ends with the weights of a straight run; the head loads with head_path and drafts."""
    from pipelines import tiny_janus_pipeline
    from safetensors.torch import load_file

    from mmspec import load_plugin
    from mmspec.plugins.lantern.train import train_eagle_head

    pipe = tiny_janus_pipeline()
    pipe.set_progress_bar_config(disable=True)
    options = dict(batch_size=4, num_sequences=12, num_heldout=4, eval_every=2, seed=1, log=lambda _: None)
    train_eagle_head(pipe, tmp_path / "part", steps=2, work_dir=tmp_path / "work", **options)
    resumed = train_eagle_head(pipe, tmp_path / "resumed", steps=4, work_dir=tmp_path / "work", **options)
    straight = train_eagle_head(pipe, tmp_path / "straight", steps=4, work_dir=tmp_path / "fresh", **options)
    a, b = (load_file(tmp_path / name / "diffusion_pytorch_model.safetensors") for name in ("resumed", "straight"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed == {**straight, "load_with": {"head_path": str(tmp_path / "resumed")}}
    assert all(p.requires_grad for p in pipe.transformer.parameters())  # the caller's model is given back as it was
    lantern = load_plugin("eagle", pipeline=pipe, head_path=str(tmp_path / "resumed"))
    prompts = ["a b", "c"]
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(2)]  # noqa: E731
    ar = pipe(prompt=prompts, temperature=0.0, generator=gens(), output_type="pt")
    out = lantern(prompt=prompts, temperature=0.0, generator=gens(), output_type="pt")
    assert torch.equal(out.tokens, ar.tokens) and out.stats.drafter_nfe > 0
    with pytest.raises(ValueError, match="num_sequences must be an int >= 1, got 0"):
        train_eagle_head(pipe, tmp_path / "x", num_sequences=0)
