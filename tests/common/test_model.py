"""ARModel adapters: HFCausalLM against plain transformers runs (blocks, per-row crop, trees, row
selection), CFGModel guidance arithmetic, and left_align."""

import pytest
import torch

from mmspec.common.model import CFGModel, HFCausalLM, left_align
from mmspec.common.tree import TreeSpec

ATOL = 1e-5
VOCAB = 64


@pytest.fixture(scope="module")
def model(tiny_pair):
    return tiny_pair[0]


def rand_ids(shape, seed):
    return torch.randint(1, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def plain(model, seq) -> torch.Tensor:
    """Logits [L, V] of a fresh, unpadded run on one sequence."""
    seq = torch.as_tensor(seq, dtype=torch.long)
    return model(input_ids=seq[None]).logits[0].float()


@torch.no_grad()
def test_step_by_step_greedy_equals_generate(model):
    ids = rand_ids((2, 5), 0)
    n = 12
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                              pad_token_id=0)[:, ids.shape[1]:]
    lm = HFCausalLM(model)
    state, out = lm.prefill(ids)
    assert out.logits.shape == (2, 5, VOCAB) and out.logits.dtype == torch.float32
    tokens = []
    nxt = out.logits[:, -1].argmax(-1)
    for i in range(n):
        tokens.append(nxt)
        out = lm.forward(state, nxt[:, None], torch.full((2, 1), ids.shape[1] + i))
        nxt = out.logits[:, -1].argmax(-1)
    assert torch.equal(torch.stack(tokens, 1), expected)
    assert state.slots.lengths().tolist() == [5 + n, 5 + n]


@torch.no_grad()
def test_prefill_logits_match_plain_run(model):
    ids = rand_ids((2, 6), 1)
    _, out = HFCausalLM(model).prefill(ids)
    for b in range(2):
        torch.testing.assert_close(out.logits[b], plain(model, ids[b]), atol=ATOL, rtol=0)


@torch.no_grad()
def test_block_of_four_equals_one_by_one(model):
    ids = rand_ids((2, 5), 2)
    block = rand_ids((2, 4), 3)
    lm = HFCausalLM(model)
    s1, _ = lm.prefill(ids)
    at_once = lm.forward(s1, block, 5 + torch.arange(4).expand(2, 4)).logits
    s2, _ = lm.prefill(ids)
    singles = [lm.forward(s2, block[:, i:i + 1], torch.full((2, 1), 5 + i)).logits for i in range(4)]
    torch.testing.assert_close(at_once, torch.cat(singles, 1), atol=ATOL, rtol=0)
    for b in range(2):
        torch.testing.assert_close(at_once[b], plain(model, torch.cat([ids[b], block[b]]))[5:], atol=ATOL, rtol=0)


@torch.no_grad()
def test_output_hidden(model):
    ids = rand_ids((2, 4), 4)
    lm = HFCausalLM(model)
    _, out = lm.prefill(ids, output_hidden=True)
    assert out.hidden is not None and out.hidden.shape == (2, 4, model.config.hidden_size)
    _, out = lm.prefill(ids)
    assert out.hidden is None


@torch.no_grad()
def test_prefill_with_an_empty_row(model):
    """A row with no prompt tokens is allowed in prefill; its first token then starts at position 0."""
    ids = torch.tensor([[5, 6, 7], [0, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    lm = HFCausalLM(model)
    state, _ = lm.prefill(ids, mask)
    assert state.slots.lengths().tolist() == [3, 0]
    tok = torch.tensor([[9], [9]])
    out = lm.forward(state, tok, torch.tensor([[3], [0]])).logits
    torch.testing.assert_close(out[0, 0], plain(model, [5, 6, 7, 9])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(out[1, 0], plain(model, [9])[-1], atol=ATOL, rtol=0)
    state, out = lm.prefill(torch.empty(2, 0, dtype=torch.long))
    assert out is None and state.slots.num_slots == 0


@pytest.mark.parametrize("compact_slack", [64, 0])
@torch.no_grad()
def test_crop_per_row_then_ragged_positions(model, compact_slack):
    ids = rand_ids((2, 5), 5)
    lm = HFCausalLM(model, compact_slack=compact_slack)
    state, _ = lm.prefill(ids)
    lengths = torch.tensor([2, 4])
    lm.crop(state, lengths)
    assert state.slots.lengths().tolist() == [2, 4]
    new = rand_ids((2, 3), 6)
    positions = lengths[:, None] + torch.arange(3)
    out = lm.forward(state, new, positions).logits
    seqs = [torch.cat([ids[b, : lengths[b]], new[b]]) for b in range(2)]
    for b in range(2):
        torch.testing.assert_close(out[b], plain(model, seqs[b])[-3:], atol=ATOL, rtol=0)

    # A second, different rollback on top of the first (stale slots at reused positions stay hidden).
    lengths2 = torch.tensor([4, 3])
    lm.crop(state, lengths2)
    new2 = rand_ids((2, 2), 7)
    out2 = lm.forward(state, new2, lengths2[:, None] + torch.arange(2)).logits
    for b in range(2):
        seq = torch.cat([seqs[b][: lengths2[b]], new2[b]])
        torch.testing.assert_close(out2[b], plain(model, seq)[-2:], atol=ATOL, rtol=0)
    if compact_slack == 0:
        assert state.slots.num_slots == int(state.slots.lengths().max())


@torch.no_grad()
def test_tree_block_and_keep(model):
    tree = TreeSpec.full([2, 2])
    n = tree.num_nodes + 1
    prompt = rand_ids((2, 4), 8)
    lm = HFCausalLM(model)
    state, _ = lm.prefill(prompt[:, :-1])
    tokens = rand_ids((2, n), 9)
    tokens[:, 0] = prompt[:, -1]  # the root is the last committed token
    base = prompt.shape[1] - 1
    positions = base + tree.depth.expand(2, n)
    out = lm.forward(state, tokens, positions, tree=tree, tree_nodes=torch.arange(n)).logits
    assert out.shape == (2, n, VOCAB)
    for b in range(2):
        for node in range(n):
            path = tree.ancestor_mask[node].nonzero().flatten()  # root..node, ids increase with depth
            seq = torch.cat([prompt[b, :-1], tokens[b, path]])
            torch.testing.assert_close(out[b, node], plain(model, seq)[-1], atol=ATOL, rtol=0,
                                       msg=lambda m: f"row {b} node {node}: {m}")

    # Row 0 keeps root -> 1 -> 4; row 1 keeps root -> 2 only.
    path_nodes = torch.tensor([[0, 1, 4], [0, 2, -1]])
    lm.keep(state, path_nodes)
    assert state.slots.tree is None
    assert state.slots.lengths().tolist() == [base + 3, base + 2]
    nxt = rand_ids((2, 1), 10)
    kept_len = torch.tensor([3, 2])
    out = lm.forward(state, nxt, (base + kept_len)[:, None]).logits
    for b in range(2):
        path = path_nodes[b][path_nodes[b] >= 0]
        seq = torch.cat([prompt[b, :-1], tokens[b, path], nxt[b]])
        torch.testing.assert_close(out[b, 0], plain(model, seq)[-1], atol=ATOL, rtol=0)


@torch.no_grad()
def test_tree_pending_blocks_plain_tokens(model):
    tree = TreeSpec.chain(2)
    lm = HFCausalLM(model)
    state, _ = lm.prefill(rand_ids((1, 3), 11))
    lm.forward(state, rand_ids((1, 3), 12), 3 + tree.depth[None], tree=tree, tree_nodes=torch.arange(3))
    with pytest.raises(RuntimeError, match="keep"):
        lm.forward(state, rand_ids((1, 1), 13), torch.tensor([[6]]))
    with pytest.raises(ValueError, match="tree"):
        lm.forward(state, rand_ids((1, 1), 13), torch.tensor([[6]]), tree=tree)


@torch.no_grad()
def test_select_rows(model):
    ids = rand_ids((3, 5), 14)
    nxt = rand_ids((3, 2), 15)
    lm = HFCausalLM(model)
    full_state, _ = lm.prefill(ids)
    full = lm.forward(full_state, nxt, 5 + torch.arange(2).expand(3, 2)).logits

    state, _ = lm.prefill(ids)
    rows = torch.tensor([2, 0])  # drop row 1 and swap the others
    lm.select_rows(state, rows)
    assert state.slots.batch_size == 2
    out = lm.forward(state, nxt[rows], 5 + torch.arange(2).expand(2, 2)).logits
    torch.testing.assert_close(out, full[rows], atol=ATOL, rtol=0)


def cfg_batch(cond, uncond):
    """2B rows (cond then uncond), right-padded with junk tokens, and their attention mask."""
    rows = list(cond) + list(uncond)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), 7, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    return ids, mask


@pytest.mark.parametrize("scale", [0.0, 1.0, 3.5])
@torch.no_grad()
def test_cfg_combines_cond_and_uncond(model, scale):
    gen = torch.Generator().manual_seed(16)
    cond = [torch.randint(1, VOCAB, (n,), generator=gen) for n in (4, 6)]
    uncond = [torch.randint(1, VOCAB, (n,), generator=gen) for n in (2, 5)]
    ids, mask = cfg_batch(cond, uncond)
    cfg = CFGModel(HFCausalLM(model), guidance_scale=scale)
    state, out = cfg.prefill(ids, mask)
    assert out.logits.shape[0] == 2
    assert state.extra["uncond_shift"].tolist() == [-2, -1]
    for b in range(2):
        c, u = plain(model, cond[b])[-1], plain(model, uncond[b])[-1]
        torch.testing.assert_close(out.logits[b, -1], u + scale * (c - u), atol=1e-4, rtol=0)

    tok = rand_ids((2, 1), 17)
    positions = torch.tensor([[4], [6]])  # positions of the conditional rows
    out = cfg.forward(state, tok, positions).logits
    assert out.shape == (2, 1, VOCAB)
    for b in range(2):
        c = plain(model, torch.cat([cond[b], tok[b]]))[-1]
        u = plain(model, torch.cat([uncond[b], tok[b]]))[-1]
        torch.testing.assert_close(out[b, 0], u + scale * (c - u), atol=1e-4, rtol=0)

    # Roll both rows back one token (each uncond row follows with its own shift) and feed another.
    cfg.crop(state, positions[:, 0])
    tok2 = rand_ids((2, 1), 18)
    out = cfg.forward(state, tok2, positions).logits
    for b in range(2):
        c = plain(model, torch.cat([cond[b], tok2[b]]))[-1]
        u = plain(model, torch.cat([uncond[b], tok2[b]]))[-1]
        torch.testing.assert_close(out[b, 0], u + scale * (c - u), atol=1e-4, rtol=0)

    # Dropping a row keeps the other's guidance intact.
    cfg.select_rows(state, torch.tensor([1]))
    assert state.extra["uncond_shift"].tolist() == [-1]
    tok3 = rand_ids((1, 1), 19)
    out = cfg.forward(state, tok3, torch.tensor([[7]])).logits
    c = plain(model, torch.cat([cond[1], tok2[1], tok3[0]]))[-1]
    u = plain(model, torch.cat([uncond[1], tok2[1], tok3[0]]))[-1]
    torch.testing.assert_close(out[0, 0], u + scale * (c - u), atol=1e-4, rtol=0)


def test_cfg_bad_arguments(model):
    base = HFCausalLM(model)
    with pytest.raises(ValueError, match="guidance_scale"):
        CFGModel(base, guidance_scale=-0.5)
    with pytest.raises(ValueError, match="guidance_scale"):
        CFGModel(base, guidance_scale="2")
    with pytest.raises(ValueError, match="2B rows"):
        CFGModel(base, 2.0).prefill(rand_ids((3, 4), 20))


def test_cfg_nan_guidance_scale_raises(model):
    with pytest.raises(ValueError, match="guidance_scale"):
        CFGModel(HFCausalLM(model), guidance_scale=float("nan"))


def test_left_align_moves_right_padding_left():
    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0], [6, 7, 8, 9]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    out, out_mask, lengths = left_align(ids, mask)
    assert out.tolist() == [[0, 1, 2, 3], [0, 0, 4, 5], [6, 7, 8, 9]]
    assert out_mask.dtype == torch.bool
    assert out_mask.tolist() == [[False, True, True, True], [False, False, True, True], [True] * 4]
    assert lengths.tolist() == [3, 2, 4]
    # Already left-padded input is unchanged; no mask means every token counts.
    again, again_mask, _ = left_align(out, out_mask)
    assert torch.equal(again, out) and torch.equal(again_mask, out_mask)
    same, same_mask, same_len = left_align(ids, None)
    assert torch.equal(same, ids) and same_mask.all() and same_len.tolist() == [4, 4, 4]


def test_left_align_errors():
    with pytest.raises(ValueError, match="empty"):
        left_align(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 1], [0, 0]]))
    with pytest.raises(ValueError, match="empty"):
        left_align(torch.empty(2, 0, dtype=torch.long), None)
    left_align(torch.empty(2, 0, dtype=torch.long), None, allow_empty=True)
    with pytest.raises(ValueError, match="shape"):
        left_align(torch.tensor([[1, 2]]), torch.tensor([[1, 1, 1]]))
    with pytest.raises(ValueError, match="batch, length"):
        left_align(torch.tensor([1, 2, 3]), None)
