"""`ssd`: greedy output identical to AR, the sampling law (and a biased rule caught), CFG, ragged batches,
the drafter's use of the row above, the bundled heads, bad inputs."""

import pytest
import torch
from law import AcceptAll, class_grid_law, gof_pvalue, sequence_codes
from request_helpers import build_decoder

from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import CFGModel
from mmspec.common.registry import get_plugin_class
from mmspec.plugins.ssd import SpatialHeads
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


def ssd_decoder(model, heads, logits, grid, k, guidance=None, branching=""):
    plugin = get_plugin_class("ssd")(num_draft_tokens=k, tree_branching=branching)
    plugin._heads = heads
    target = LlamaGenAdapter(model)
    if guidance is not None:
        target = CFGModel(target, guidance)
    return build_decoder(plugin, target, logits, grid=grid)


def ssd_tree_decoder(model, heads, logits, grid, branching, guidance=None):
    return ssd_decoder(model, heads, logits, grid, 1, guidance, branching=branching)


def prompts(model, labels, guidance):
    cond = model.class_token(torch.tensor(labels))[:, None]
    if guidance is None:
        return cond, None
    uncond = model.class_token(torch.full((len(labels),), model.null_class))[:, None]
    return cond, (torch.cat([cond, uncond]), None)


# Trees are listed with k = their depth: each must also accept at least as much as the chain of that depth.
@pytest.mark.parametrize("k,guidance,branching", [
    (1, None, None), (3, 2.5, None), (2, None, None),
    (2, None, "3,2"), (3, 2.5, "2,2,1"), (1, None, "4"),
])
def test_greedy_equals_ar(k, guidance, branching):
    model = tiny_gen()
    heads = random_heads(model, GRID)
    cond, prefill = prompts(model, [0, 2, 1], guidance)
    greedy = LogitsPipeline(temperature=0)
    target = LlamaGenAdapter(model) if guidance is None else CFGModel(LlamaGenAdapter(model), guidance)

    def generate(decoder):
        return decoder.generate(cond, max_new_tokens=GRID * GRID, prefill_input=prefill)

    ar = generate(build_decoder(get_plugin_class("ar")(), target, greedy))
    chain = generate(ssd_decoder(model, heads, greedy, (GRID, GRID), k, guidance))
    assert torch.equal(chain.sequences, ar.sequences)
    if branching is None:
        return
    assert len(branching.split(",")) == k
    tree = generate(ssd_tree_decoder(model, heads, greedy, (GRID, GRID), branching, guidance))
    assert torch.equal(tree.sequences, ar.sequences)
    assert tree.stats.mean_accepted >= chain.stats.mean_accepted  # more candidates per position, same depth


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


def pvalue(decoder, model, law):
    cond = model.class_token(torch.full((LAW_SAMPLES, 1), 1))
    out = decoder.generate(cond, max_new_tokens=LAW_H * LAW_W, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(sequence_codes(out.sequences, LAW_VOCAB), minlength=LAW_VOCAB ** (LAW_H * LAW_W))
    return gof_pvalue(counts, law), out.stats


def test_sampling_follows_the_ar_law_and_a_biased_rule_is_caught():
    model = tiny_gen(vocab=LAW_VOCAB, grid=3, seed=3, std=0.8)
    heads = random_heads(model, LAW_W, seed=4)
    logits = LogitsPipeline(temperature=1.0)
    law = class_grid_law(model, 1, LAW_H * LAW_W)
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


def test_bundled_heads_beat_untrained_heads():
    """On the bundled model, training raised acceptance: the shipped heads against the same heads before
    training (both projections = the target's output layer), same images and seeds."""
    from mmspec.plugins.ssd import load_bundled_heads
    from mmspec.vision.pipeline import bundled_pipeline

    pipe = bundled_pipeline()
    pipe.set_progress_bar_config(disable=True)
    trained = load_bundled_heads()
    assert trained.config.grid_width == pipe.grid_size
    untrained = SpatialHeads(hidden_size=trained.config.hidden_size, vocab_size=trained.config.vocab_size,
                             grid_width=trained.config.grid_width)
    untrained.init_from_lm_head(pipe.transformer.output.weight.float())
    untrained.prior_logits.copy_(trained.prior_logits)
    accepted = {}
    for name, heads in (("trained", trained), ("untrained", untrained.eval())):
        plugin = get_plugin_class("ssd")(num_draft_tokens=3)
        plugin._heads = heads
        gens = [torch.Generator().manual_seed(i) for i in range(4)]
        accepted[name] = plugin.attach(pipe)(class_labels=[0, 3, 5, 8], generator=gens, output_type="pt").stats.mean_accepted
    assert accepted["trained"] > accepted["untrained"] + 0.15, accepted


def test_bad_inputs():
    plugin_cls = get_plugin_class("ssd")
    model = tiny_gen()
    with pytest.raises(ValueError, match="num_draft_tokens"):
        plugin_cls(num_draft_tokens=0)
    with pytest.raises(ValueError, match="grid width"):
        ssd_decoder(model, random_heads(model, GRID), LogitsPipeline(), (GRID, GRID), GRID)
    with pytest.raises(ValueError, match="trained for grid width"):
        ssd_decoder(model, random_heads(model, GRID + 2), LogitsPipeline(), (GRID, GRID), 2)
    wrong_vocab = SpatialHeads(hidden_size=32, vocab_size=7, grid_width=GRID)
    with pytest.raises(ValueError, match="vocabulary"):
        ssd_decoder(model, wrong_vocab, LogitsPipeline(), (GRID, GRID), 2)
    with pytest.raises(ValueError, match="heads_path"):
        build_decoder(plugin_cls(heads_path="/nonexistent/heads"), LlamaGenAdapter(model), LogitsPipeline(),
                      grid=(GRID, GRID))


@pytest.mark.train
def test_train_ssd_heads_for_a_hf_model_resumes_to_identical_weights(tmp_path):
    """`train_ssd_heads` (what `mmspec train-head ssd` runs) on a tiny Janus: both heads' held-out expected
    acceptance rises; a run stopped at step 3 and resumed from its work folder ends with a straight run's
    weights; the heads load with heads_path=, draft tokens the target keeps, and give AR's greedy images (with
    guidance: the unconditional rows are drafted too)."""
    from pipelines import tiny_janus_pipeline
    from safetensors.torch import load_file

    from mmspec import load_plugin
    from mmspec.plugins.ssd.train import train_ssd_heads

    pipe = tiny_janus_pipeline()
    pipe.set_progress_bar_config(disable=True)
    options = dict(batch_size=8, num_sequences=48, num_heldout=8, eval_every=3, seed=1, log=lambda _: None)
    train_ssd_heads(pipe, tmp_path / "part", steps=3, work_dir=tmp_path / "work", **options)
    resumed = train_ssd_heads(pipe, tmp_path / "resumed", steps=6, work_dir=tmp_path / "work", **options)
    straight = train_ssd_heads(pipe, tmp_path / "straight", steps=6, work_dir=tmp_path / "fresh", **options)
    a, b = (load_file(tmp_path / name / "diffusion_pytorch_model.safetensors") for name in ("resumed", "straight"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed == {**straight, "load_with": {"heads_path": str(tmp_path / "resumed")}}
    # (the interrupted run stops within the warm-up, where the learning rate does not depend on the total)
    trained = train_ssd_heads(pipe, tmp_path / "trained", steps=80, **options)
    for head in ("right", "below"):
        assert trained["expected_acceptance"][head] > trained["expected_acceptance_before"][head] + 0.02, trained
    assert all(p.requires_grad for p in pipe.transformer.parameters())  # the caller's model is given back as it was

    ssd = load_plugin("ssd", pipeline=pipe, heads_path=str(tmp_path / "trained"), num_draft_tokens=2)
    prompts = ["a b", "c", "a", "b c"]
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(4)]  # noqa: E731
    ar = pipe(prompt=prompts, temperature=0.0, guidance_scale=2.0, generator=gens(), output_type="pt")
    out = ssd(prompt=prompts, temperature=0.0, guidance_scale=2.0, generator=gens(), output_type="pt")
    assert torch.equal(out.tokens, ar.tokens) and out.stats.mean_accepted > 1
    with pytest.raises(ValueError, match="num_heldout must be an int >= 1, got 0"):
        train_ssd_heads(pipe, tmp_path / "x", num_heldout=0)


def test_tree_draft_nodes_are_each_positions_top_candidates():
    model = tiny_gen()
    heads = random_heads(model, GRID)
    drafter = ssd_tree_decoder(model, heads, LogitsPipeline(temperature=0), (GRID, GRID), "3,2").drafter
    drafter.begin(None, None)
    ctx = type("Ctx", (), {})()
    ctx.last_tokens, ctx.positions = torch.tensor([16]), torch.tensor([0])
    ctx.num_draft_tokens, ctx.logits, ctx.generator = 0, LogitsPipeline(temperature=0), None
    draft = drafter.propose(ctx)  # nothing verified yet: every position drafts from the prior
    top = heads.prior_logits.topk(3).indices.tolist()
    # Depth 1: the top 3; depth 2: under each of them, the top 2 of the same distribution.
    assert draft.tokens[0].tolist() == top + top[:2] * 3 and draft.tree.num_nodes == 9


@pytest.mark.parametrize("sampled_children", [True, False], ids=["sampled-first-child", "top-ranked-children"])
def test_tree_sampling_follows_the_ar_law(sampled_children):
    """Static trees under sampling: each node's first child drawn from the heads (the plugin's default), or
    every child a top-ranked token; either way the output law is AR's, and accepting everything is caught."""
    model = tiny_gen(vocab=LAW_VOCAB, grid=3, seed=3, std=0.8)
    heads = random_heads(model, LAW_W, seed=4)
    law = class_grid_law(model, 1, LAW_H * LAW_W)
    decoder = ssd_tree_decoder(model, heads, LogitsPipeline(temperature=1.0), (LAW_H, LAW_W), "2,2")
    assert decoder.drafter.sampled_children  # what the plugin builds
    decoder.drafter.sampled_children = sampled_children
    p, stats = pvalue(decoder, model, law)
    assert p > 1e-3 and 1.2 < stats.mean_accepted < 3.0
    decoder.accept_rule = AcceptAll()
    assert pvalue(decoder, model, law)[0] < 1e-6


def test_tree_first_children_not_drawn_from_the_heads_are_caught():
    """A planted bug: first children taken as the heads' argmax while the draft says they were sampled."""
    model = tiny_gen(vocab=LAW_VOCAB, grid=3, seed=3, std=0.8)
    heads = random_heads(model, LAW_W, seed=4)
    law = class_grid_law(model, 1, LAW_H * LAW_W)
    decoder = ssd_tree_decoder(model, heads, LogitsPipeline(temperature=1.0), (LAW_H, LAW_W), "2,2")
    propose = decoder.drafter.propose

    def argmax_first_children(ctx):
        draft = propose(ctx)
        tree = draft.tree
        for node in range(1, tree.num_nodes + 1):
            if tree.ranks[node] == 0:
                draft.tokens[:, node - 1] = draft.probs[:, tree.parents[node]].argmax(-1)
        return draft

    decoder.drafter.propose = argmax_first_children
    assert pvalue(decoder, model, law)[0] < 1e-6
