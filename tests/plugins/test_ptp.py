"""`ptp`: registers ride along the verify pass without changing the model's own path, greedy output equals
plain AR token for token (pages and regions, batched, ragged acceptance), sampling follows the target's law
(and a planted bias is caught), bad configurations are refused, and training resumes to the same registers."""

import warnings

import pytest
import torch
from law import AcceptAll, exact_prompt_law, prompt_law_pvalue, sharpened_tiny_lm
from register_helpers import random_registers

from mmspec import load_plugin
from mmspec.common.accept import Draft
from mmspec.common.draft import StepContext
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import HFCausalLM
from mmspec.common.stats import DecodeStats
from mmspec.docs_parse.pages import load_held_out_set
from mmspec.plugins.ptp import PTPDecoder, register_tree
from mmspec.plugins.ptp.registers import RegisterSet, inject
from mmspec.plugins.ptp.training import register_batch


@pytest.fixture(scope="module")
def doc_pipe():
    return load_plugin("ar", model="doc-tiny")


@pytest.fixture(scope="module")
def held_out():
    return load_held_out_set()[:3]


def test_the_register_tree_hangs_a_group_after_every_chain_node():
    tree = register_tree(3)
    spec = tree.spec
    assert spec.num_nodes == 3 + 4 * 3
    assert spec.depth[tree.chain].tolist() == [1, 2, 3]
    for i in range(4):
        assert spec.depth[tree.groups[i]].tolist() == [i + 1, i + 2, i + 3]  # register j of group i: p+i+j
        first = int(tree.groups[i, 0])
        parent_chain = 0 if i == 0 else int(tree.chain[i - 1])
        assert int(spec.parent[first]) == parent_chain
    chain_and_root = torch.cat([torch.zeros(1, dtype=torch.long), tree.chain])
    # no chain node has a register among its ancestors
    assert not spec.ancestor_mask[chain_and_root][:, tree.groups.flatten()].any()


def test_registers_are_invisible_to_ordinary_tokens():
    """The chain's logits do not depend on the registers at all (bitwise), and match a forward without them."""
    model = sharpened_tiny_lm(vocab=6, seed=3)
    target = HFCausalLM(model)
    logits = LogitsPipeline(temperature=0.0)
    prompt = torch.tensor([[1, 2, 3, 4], [0, 5, 1, 2]])
    outs = []
    for seed in (0, 1):
        registers = random_registers(model, 3, "model.layers", seed=seed)
        decoder = PTPDecoder(target, registers, logits, 3)
        state, _ = target.prefill(prompt[:, :-1])
        drafts = torch.tensor([[1, 2, 3], [4, 4, 0]])
        ctx = StepContext(prompt[:, -1], torch.tensor([3, 3]), 3, logits, None, torch.tensor([10, 10]))
        probs, out = decoder._verify(state, ctx, Draft(drafts, lengths=torch.tensor([3, 3])), DecodeStats())
        chain = torch.cat([torch.zeros(1, dtype=torch.long), register_tree(3).chain])
        outs.append(out.logits[:, chain])
        registers_out = out.logits[:, register_tree(3).groups.flatten()]
    assert torch.equal(outs[0], outs[1])
    plain = model(torch.cat([prompt, torch.tensor([[1, 2, 3], [4, 4, 0]])], 1)).logits[:, 3:].float()
    torch.testing.assert_close(outs[0], plain, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(registers_out[0, :3], outs[0][0, :3])  # registers do compute something else


def test_training_rows_are_masked_as_at_inference():
    tokens, positions, mask, labels, index = register_batch(
        [[5, 6, 7, 8, 9, 10]], [2], k=2, anchors=8, vocab_size=100, pad_id=0, generator=torch.Generator())
    # anchors t = 1..3 (t = P-1 .. T-3); group after t: registers at t+1, t+2 predicting tokens t+2, t+3
    assert tokens[0, 6:].tolist() == [100, 101] * 3
    assert positions[0, 6:].tolist() == [2, 3, 3, 4, 4, 5]
    assert labels[0, 6:].tolist() == [8, 9, 9, 10, 10, -100]  # past the end: no label
    assert index[0].tolist() == [-1] * 6 + [0, 1] * 3
    assert mask[0, 8].nonzero().flatten().tolist() == [0, 1, 2, 8]  # group t=2, register 1: prefix <= 2, itself
    assert mask[0, 9].nonzero().flatten().tolist() == [0, 1, 2, 8, 9]
    assert not mask[0, :6, 6:].any()  # ordinary tokens never see registers
    assert torch.equal(mask[0, :6, :6], torch.ones(6, 6, dtype=torch.bool).tril())


def test_greedy_ptp_equals_ar_on_pages_and_regions_with_ragged_acceptance(doc_pipe, held_out):
    pages = [row["image"] for row in held_out]
    regions = [[tuple(b.box) for b in row["blocks"][:3]] for row in held_out]
    accepted_per_step = []
    for kwargs in (dict(mode="page", max_new_tokens=80), dict(mode="regions", regions=regions, max_new_tokens=60)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pages cut at max_new_tokens
            ar = doc_pipe(pages, batch_size=3, **kwargs)
            for k in (2, 6):
                ptp = load_plugin("ptp", pipeline=doc_pipe, num_draft_tokens=k)
                original = ptp.plugin.build_decoder

                def recording(pipeline, request, original=original):
                    decoder = original(pipeline, request)
                    run = decoder.generate

                    def generate(*args, callback=None, **kw):
                        return run(*args, callback=lambda s, info: accepted_per_step.append(info["num_accepted"]),
                                   **kw)
                    decoder.generate = generate
                    return decoder
                ptp.plugin.build_decoder = recording
                out = ptp(pages, batch_size=3, **kwargs)
                assert out.sequences == ar.sequences and out.markdown == ar.markdown, (kwargs["mode"], k)
                assert out.stats.target_nfe < ar.stats.target_nfe  # the trained registers are accepted
    # The three pages open alike (a small model), so page mode accepts alike; region rows differ.
    ragged = [a for a in accepted_per_step if a.numel() > 1 and len(set(a.tolist())) > 1]
    assert ragged, "rows of a batch should accept different numbers of drafts"


VOCAB, NEW_TOKENS, SAMPLES = 4, 4, 30_000
PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def law_setup():
    model = sharpened_tiny_lm(vocab=VOCAB, seed=21)
    logits = LogitsPipeline(temperature=1.0)
    # Strong register embeddings: their q is far from the target's p, so acceptance and rejection both happen.
    registers = random_registers(model, 2, "model.layers", seed=4, scale=3.0)
    return model, logits, registers, exact_prompt_law(model, logits, PROMPT, NEW_TOKENS)


def test_ptp_sampling_follows_the_target_law(law_setup, torch_kernels):
    model, logits, registers, law = law_setup
    decoder = PTPDecoder(HFCausalLM(model), registers, logits, 2)
    pvalue, stats = prompt_law_pvalue(decoder, law, PROMPT, VOCAB, NEW_TOKENS, SAMPLES)
    assert 1.1 < stats.mean_accepted < 2.9  # both accepted and rejected drafts happened (1 = none, 3 = all)
    assert pvalue > 1e-3


def test_a_planted_bias_fails_the_law_test(law_setup, torch_kernels):
    model, logits, registers, law = law_setup
    decoder = PTPDecoder(HFCausalLM(model), registers, logits, 2)
    decoder.accept_rule = AcceptAll()  # keep every register draft: the output follows q, not p
    pvalue, _ = prompt_law_pvalue(decoder, law, PROMPT, VOCAB, NEW_TOKENS, SAMPLES)
    assert pvalue < 1e-6


def test_bad_configurations_are_refused_with_the_argument_named(doc_pipe, tmp_path):
    with pytest.raises(ValueError, match="num_draft_tokens"):
        load_plugin("ptp", pipeline=doc_pipe, num_draft_tokens=0)
    with pytest.raises(ValueError, match="k must be between 1 and 16"):
        load_plugin("ptp", pipeline=doc_pipe, num_draft_tokens=17)
    other = sharpened_tiny_lm(vocab=8)
    random_registers(other, 4).save_pretrained(tmp_path / "narrow")
    with pytest.raises(ValueError, match="another model"):
        load_plugin("ptp", pipeline=doc_pipe, registers_path=str(tmp_path / "narrow"))
    model = doc_pipe.model
    wrong_vocab = RegisterSet(num_registers=4, hidden_size=model.get_input_embeddings().weight.shape[1], vocab_size=7)
    wrong_vocab.save_pretrained(tmp_path / "vocab")
    with pytest.raises(ValueError, match="7-token vocabulary"):
        load_plugin("ptp", pipeline=doc_pipe, registers_path=str(tmp_path / "vocab"))
    with pytest.raises(ValueError, match="registers_path"):
        load_plugin("ptp", pipeline=doc_pipe, registers_path=str(tmp_path / "missing"))
    ptp = load_plugin("ptp", pipeline=doc_pipe, num_draft_tokens=16)
    page = load_held_out_set()[0]["image"]
    with pytest.raises(ValueError, match="position budget"):
        ptp(page, max_new_tokens=doc_pipe.max_positions - 80)
    text = load_plugin("ar", model="text-tiny")
    with pytest.raises(ValueError, match="ptp"):
        load_plugin("ptp", pipeline=text)


def test_saved_pipeline_keeps_the_registers(doc_pipe, tmp_path):
    from mmspec.docs_parse.pipeline import DocParsePipeline

    ptp = load_plugin("ptp", pipeline=doc_pipe, num_draft_tokens=3)
    ptp.save_pretrained(tmp_path / "bundle")
    again = DocParsePipeline.from_pretrained(tmp_path / "bundle")
    assert again.plugin.name == "ptp" and again.plugin.config.num_draft_tokens == 3
    assert torch.equal(again.plugin.registers().embeddings, ptp.plugin.registers().embeddings)


def test_register_hooks_leave_the_model_untouched_afterwards():
    model = sharpened_tiny_lm(vocab=6, seed=3)
    registers = random_registers(model, 2, "model.layers")
    ids = torch.tensor([[1, 2, 3]])
    before = model(ids).logits
    with inject(registers, model, model.get_input_embeddings(), 6):
        with_hooks = model(ids).logits  # no register ids: nothing changes
        with_register = model(torch.tensor([[1, 2, 6]])).logits
    assert torch.equal(before, with_hooks) and torch.equal(model(ids).logits, before)
    assert not torch.equal(with_register[0, -1], before[0, -1])


@pytest.mark.parametrize("k", [1, 3, 16])
def test_the_verify_input_kernel_equals_its_torch_reference(k, monkeypatch):
    from mmspec.plugins.ptp.kernels import verify_inputs, verify_inputs_reference

    tree = register_tree(k)
    g = torch.Generator().manual_seed(k)
    batch = 5
    last = torch.randint(0, 50, (batch,), generator=g)
    drafts = torch.randint(0, 50, (batch, k), generator=g)
    lengths = torch.randint(0, k + 1, (batch,), generator=g)
    positions = torch.randint(0, 300, (batch,), generator=g)
    want = verify_inputs_reference(tree.table, last, drafts, lengths, positions, 50)
    monkeypatch.setenv("MMSPEC_KERNELS", "triton")
    got = verify_inputs(tree.table, last, drafts, lengths, positions, 50)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    tokens, pos, needed = want
    assert torch.equal(tokens[:, 0], last) and torch.equal(tokens[:, tree.chain], drafts)
    assert torch.equal(tokens[:, tree.groups[2 % (k + 1)]], torch.arange(50, 50 + k).expand(batch, -1))
    assert torch.equal(pos, positions[:, None] + tree.spec.depth[None])
    # a row with draft length n keeps its first n drafts and the register groups after chain nodes 0..n
    for b in range(batch):
        n = int(lengths[b])
        assert needed[b, tree.chain].tolist() == [d < n for d in range(k)]
        assert needed[b, tree.groups].all(1).tolist() == [i <= n for i in range(k + 1)]


def test_the_prompt_lookup_peer_reproduces_ar(doc_pipe, held_out):
    rows = held_out[:2]
    settings = {**doc_pipe.call_defaults, "max_new_tokens": 40}
    peer = load_plugin("ptp", pipeline=doc_pipe, num_draft_tokens=4).plugin.bench_peer(doc_pipe, rows, settings)
    ar, _ = doc_pipe.bench_generate(rows, 2, 0, settings)
    assert peer["sequences"] == ar and peer["name"] == "transformers prompt-lookup decoding"
    assert 0 < peer["nfe_per_sample"] <= 40
    assert load_plugin("ptp", pipeline=doc_pipe).plugin.bench_peer(doc_pipe, rows, {**settings, "mode": "layout"}) is None


def test_a_copy_candidate_is_what_followed_the_last_tokens_before():
    from mmspec.plugins.ptp import copy_candidate

    history = [5, 6, 7, 8, 9, 5, 6]
    assert copy_candidate(history, 2, 3) == [7, 8, 9]
    assert copy_candidate(history, 2, 10) == [7, 8, 9, 5, 6]
    assert copy_candidate(history, 3, 4) == [] and copy_candidate(history, 2, 0) == []
    assert copy_candidate([1, 2, 1, 2, 1, 2], 2, 2) == [1, 2]  # the most recent earlier occurrence


def test_copy_drafts_keep_greedy_exact_on_table_regions(doc_pipe, held_out):
    pages = [row["image"] for row in held_out]
    regions = [[tuple(b.box) for b in row["blocks"] if b.type == "table"] for row in held_out]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ar = doc_pipe(pages, mode="regions", regions=regions, batch_size=3, max_new_tokens=120)
        copying = load_plugin("ptp", pipeline=doc_pipe, num_draft_tokens=4, copy_draft=24)
        out = copying(pages, mode="regions", regions=regions, batch_size=3, max_new_tokens=120)
    assert out.sequences == ar.sequences
    assert max(i for i, n in enumerate(out.stats.accepted_hist) if n) > 5  # a copy longer than k was accepted


def test_ptp_sampling_with_copy_drafts_follows_the_target_law(law_setup, torch_kernels):
    model, logits, registers, law = law_setup
    decoder = PTPDecoder(HFCausalLM(model), registers, logits, 2, copy_length=3)
    decoder.drafter.copy_match = 1  # copy after any repeated token: copies are frequent in 4-token sequences
    pvalue, stats = prompt_law_pvalue(decoder, law, PROMPT, VOCAB, NEW_TOKENS, SAMPLES, seed=3)
    assert 1.1 < stats.mean_accepted
    assert pvalue > 1e-3


def test_copy_drafts_see_the_whole_prompt():
    """The history a copy is looked up in holds the prompt's last token too (fed with the first step, not given
    to `begin`): here the repeat [1, 2] spans it."""
    from mmspec.common.accept import Acceptance
    from mmspec.plugins.ptp import RegisterDrafter

    drafter = RegisterDrafter(k=1, vocab_size=4, copy_length=3, copy_match=2)
    drafter.begin(torch.tensor([[0, 1, 2, 3, 0]]), None)  # the prompt [0, 1, 2, 3, 0, 1] without its last token
    drafter.tokens, drafter.lengths = torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    ctx = StepContext(torch.tensor([1]), torch.tensor([5]), 3, LogitsPipeline(temperature=0.0), None,
                      torch.tensor([10]))
    step = Acceptance(num_accepted=torch.tensor([0]), tokens=torch.tensor([[2, -1, -1, -1]]))  # no draft; extra 2
    drafter._offer_copies(ctx, step, left=torch.tensor([9]))
    assert drafter.history[0] == [0, 1, 2, 3, 0, 1]
    assert drafter.tokens.tolist() == [[3, 0, 1]] and drafter.lengths.tolist() == [3]  # what followed [1, 2]


def test_streamed_region_rows_equal_the_two_passes(doc_pipe, held_out):
    """layout+regions with region rows joining the running layout pass (HPD-style) gives the output of the
    layout pass followed by the region pass: greedy for ar and ptp (with copy drafts), and sampled with one
    generator per page (in float64: float32 logits round differently in batches of other shapes, which moves
    a rare sample); the overlap shows as fewer decode steps, and a page's regions do not depend on the batch."""
    pages = [row["image"] for row in held_out]
    sampling = load_plugin("ptp", model="doc-tiny", num_draft_tokens=4)
    sampling.model.double()
    sampling.plugin.registers().double()
    runs = [(doc_pipe, {}), (load_plugin("ptp", pipeline=doc_pipe, num_draft_tokens=4, copy_draft=8), {}),
            (sampling, {"temperature": 1.0})]
    for pipe, call in runs:
        outs = {}
        for stream in (False, True):
            gens = [torch.Generator().manual_seed(20 + i) for i in range(3)] if call else None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pages cut at max_new_tokens
                outs[stream] = pipe(pages, mode="layout+regions", batch_size=3, stream=stream, max_new_tokens=60,
                                    generator=gens, **call)
        streamed, two_pass = outs[True], outs[False]
        name = (pipe.plugin.name if pipe.plugin is not None else "ar")
        assert streamed.sequences == two_pass.sequences and streamed.markdown == two_pass.markdown, (name, call)
        assert [[b.box for b in p] for p in streamed.blocks] == [[b.box for b in p] for p in two_pass.blocks]
        regions = streamed.stats.extra["regions"]
        assert regions >= 9 and streamed.stats.extra["admitted_rows"] == regions
        assert streamed.stats.extra["streamed_calls"] == 1 and "streamed_calls" not in two_pass.stats.extra
        assert streamed.stats.target_nfe < two_pass.stats.target_nfe, name  # regions ran during the layout pass
    alone = sampling(pages[2:], mode="layout+regions", max_new_tokens=60, temperature=1.0,
                     generator=[torch.Generator().manual_seed(22)])
    assert alone.sequences[0] == streamed.sequences[2]
