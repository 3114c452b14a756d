"""The decode loop: greedy equivalence with plain AR and transformers, ragged batches, EOS, trees."""

import pytest
import torch
from tiny_models import perturbed_copy, tiny_llama

from mmspec.common.accept import GreedyMatch, SpeculativeSampling
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.draft import DraftModelDrafter
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import ARModel, HFCausalLM
from mmspec.common.tree import parse_branching

GREEDY = LogitsPipeline(temperature=0)


def hf_greedy(model, ids, n, eos=None):
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=eos, pad_token_id=eos if eos is not None else 0)
    return out[:, ids.shape[1]:]


def spec_decoder(target, draft, k=4, tree=None, logits=GREEDY, eos=None):
    return SpeculativeDecoder(HFCausalLM(target), DraftModelDrafter(HFCausalLM(draft), tree=tree),
                              logits=logits, num_draft_tokens=0 if tree else k, eos_token_id=eos,
                              pad_token_id=eos if eos is not None else -1)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_ar_and_transformers(tiny_pair, batch, k):
    target, draft = tiny_pair
    ids = torch.randint(1, 64, (batch, 6), generator=torch.Generator().manual_seed(batch))
    expected = hf_greedy(target, ids, 48)
    ar = SpeculativeDecoder(HFCausalLM(target), logits=GREEDY).generate(ids, max_new_tokens=48)
    spec = spec_decoder(target, draft, k).generate(ids, max_new_tokens=48)
    assert torch.equal(ar.sequences, expected)
    assert torch.equal(spec.sequences, expected)
    assert ar.stats.target_nfe == 48 and ar.stats.nfe_per_sample == 48
    # The draft is right sometimes and wrong sometimes: several accepted lengths occur.
    assert sum(1 for n in spec.stats.accepted_hist if n) >= min(3, k + 1)
    assert spec.stats.target_nfe < 48


def test_ragged_batch_rows_progress_independently(tiny_pair):
    """Rows with different acceptance finish at different steps; each equals its batch-1 run."""
    target, draft = tiny_pair
    ids = torch.randint(1, 64, (4, 5), generator=torch.Generator().manual_seed(7))
    batched = spec_decoder(target, draft).generate(ids, max_new_tokens=40)
    steps = []
    for b in range(4):
        single = spec_decoder(target, draft).generate(ids[b:b + 1], max_new_tokens=40)
        assert torch.equal(single.sequences[0], batched.sequences[b])
        steps.append(single.stats.target_nfe)
    assert len(set(steps)) > 1, "rows should need different numbers of steps"
    assert batched.stats.target_nfe == max(steps)
    assert batched.stats.row_steps == sum(steps)


def test_ragged_prompts_left_or_right_padded(tiny_pair):
    target, draft = tiny_pair
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 64, (n,), generator=gen) for n in (2, 7, 4)]
    width = 7
    right = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.bool)
    for i, p in enumerate(prompts):
        right[i, : len(p)], mask[i, : len(p)] = p, True
    out = spec_decoder(target, draft).generate(right, mask, max_new_tokens=30)
    for i, p in enumerate(prompts):
        assert torch.equal(out.sequences[i], hf_greedy(target, p[None], 30)[0])


def test_prompt_of_one_token(tiny_pair):
    target, draft = tiny_pair
    ids = torch.tensor([[5], [9]])
    out = spec_decoder(target, draft).generate(ids, max_new_tokens=20)
    assert torch.equal(out.sequences, hf_greedy(target, ids, 20))
    assert out.stats.prefill_nfe == 0


def test_eos_stops_each_row_and_pads():
    target = tiny_llama(vocab_size=16, seed=4)
    draft = perturbed_copy(target, 0.3)
    ids = torch.randint(1, 16, (6, 3), generator=torch.Generator().manual_seed(0))
    eos = 3
    expected = hf_greedy(target, ids, 40, eos=eos)
    out = spec_decoder(target, draft, eos=eos).generate(ids, max_new_tokens=40)
    assert torch.equal(out.sequences, expected)
    stopped = (out.lengths < 40)
    assert stopped.any(), "this seed must hit EOS in some row"
    for row in stopped.nonzero().flatten():
        assert out.sequences[row, out.lengths[row] - 1] == eos


@pytest.mark.parametrize("branching", ["2,2,1", "3,1", "1,1,1,1", "0;1;2;0.0;0.1;1.0;0.0.0"])
def test_tree_greedy_equals_ar(tiny_pair, branching):
    """Full trees, and an uneven one whose leaves at inner depths the draft model never runs on."""
    target, draft = tiny_pair
    ids = torch.randint(1, 64, (3, 5), generator=torch.Generator().manual_seed(11))
    tree = parse_branching(branching)
    out = spec_decoder(target, draft, tree=tree).generate(ids, max_new_tokens=40)
    assert torch.equal(out.sequences, hf_greedy(target, ids, 40))
    assert out.stats.target_nfe < 40


def test_self_draft_accepts_everything(tiny_pair):
    target, _ = tiny_pair
    ids = torch.randint(1, 64, (2, 4), generator=torch.Generator().manual_seed(1))
    out = spec_decoder(target, target, k=3).generate(ids, max_new_tokens=32)
    assert out.stats.acceptance_per_position == [1.0, 1.0, 1.0]
    assert out.stats.target_nfe == 8 and out.stats.mean_accepted == 4.0


def test_sampling_is_deterministic_per_row_generator(tiny_pair, torch_kernels):
    target, draft = tiny_pair
    ids = torch.randint(1, 64, (3, 4), generator=torch.Generator().manual_seed(2))
    logits = LogitsPipeline(temperature=1.0, top_k=20)

    def run(rows, seeds):
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        return spec_decoder(target, draft, logits=logits).generate(ids[rows], max_new_tokens=24, generator=gens)

    batched = run([0, 1, 2], [10, 11, 12])
    again = run([0, 1, 2], [10, 11, 12])
    assert torch.equal(batched.sequences, again.sequences)
    for b in range(3):
        assert torch.equal(run([b], [10 + b]).sequences[0], batched.sequences[b])


def test_kv_cache_compaction_keeps_output_exact(tiny_pair):
    """Rejected drafts leave dead slots; compaction gathers live ones without changing any token."""
    target, draft = tiny_pair
    ids = torch.randint(1, 64, (2, 4), generator=torch.Generator().manual_seed(5))
    decoder = SpeculativeDecoder(HFCausalLM(target, compact_slack=4), DraftModelDrafter(HFCausalLM(draft)),
                                 logits=GREEDY, num_draft_tokens=6)
    seen = []
    original = decoder.target.crop

    def crop(state, lengths):
        original(state, lengths)
        seen.append((state.slots.num_slots, int(state.slots.lengths().max())))

    decoder.target.crop = crop
    out = decoder.generate(ids, max_new_tokens=80)
    assert torch.equal(out.sequences, hf_greedy(target, ids, 80))
    assert any(b[0] < a[0] for a, b in zip(seen, seen[1:])), "compaction never ran"
    # A tidy reads the device, so it waits for TIDY_EVERY rollbacks (one crop per chain step, each step
    # appending up to K + 1 = 7 slots) and for 2 * compact_slack slots of growth; dead slots stay bounded by that.
    assert all(slots <= live + 2 * 4 + ARModel.TIDY_EVERY * 7 for slots, live in seen)


def test_bad_inputs(tiny_pair):
    target, draft = tiny_pair
    dec = spec_decoder(target, draft)
    with pytest.raises(ValueError, match="empty"):
        dec.generate(torch.empty(2, 0, dtype=torch.long), max_new_tokens=4)
    with pytest.raises(ValueError, match="empty"):
        dec.generate(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 1], [0, 0]]), max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate(torch.tensor([[1, 2]]), max_new_tokens=0)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        SpeculativeDecoder(HFCausalLM(target), DraftModelDrafter(HFCausalLM(draft)), num_draft_tokens=0)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        SpeculativeDecoder(HFCausalLM(target), DraftModelDrafter(HFCausalLM(draft)), num_draft_tokens=-1)
    other = tiny_llama(vocab_size=80)
    with pytest.raises(ValueError, match="vocabulary"):
        SpeculativeDecoder(HFCausalLM(target), DraftModelDrafter(HFCausalLM(other)), num_draft_tokens=2)
    with pytest.raises(ValueError, match="generator"):
        dec.generate(torch.tensor([[1, 2], [3, 4]]), max_new_tokens=4, generator=[torch.Generator()])


def test_default_rules_follow_the_logits_pipeline(tiny_pair):
    target, _ = tiny_pair
    assert isinstance(SpeculativeDecoder(HFCausalLM(target), logits=GREEDY).accept_rule, GreedyMatch)
    assert isinstance(SpeculativeDecoder(HFCausalLM(target)).accept_rule, SpeculativeSampling)


class FixedChains:
    """Drafts each row's fixed continuation once, with its own length (a ragged chain), then nothing."""

    def __init__(self, chains):
        width = max(len(c) for c in chains)
        self.tokens = torch.tensor([c + [0] * (width - len(c)) for c in chains])
        self.lengths = torch.tensor([len(c) for c in chains])
        self.done = False
        self.tree = None

    def begin(self, ids, mask):
        pass

    def propose(self, ctx):
        from mmspec.common.accept import Draft

        if self.done:
            return Draft(tokens=torch.empty(len(ctx.last_tokens), 0, dtype=torch.long))
        self.done = True
        return Draft(tokens=self.tokens, lengths=self.lengths)

    def commit(self, *args, **kwargs):
        pass

    def select_rows(self, rows):
        self.tokens, self.lengths = self.tokens[rows], self.lengths[rows]


def test_ragged_chain_lengths_are_respected(tiny_pair):
    """Draft.lengths: padding past a row's length is never fed or accepted, and per-position acceptance
    counts only rows that drafted there."""
    target, _ = tiny_pair
    ids = torch.randint(1, 64, (3, 5), generator=torch.Generator().manual_seed(4))
    ar = SpeculativeDecoder(HFCausalLM(target), logits=GREEDY).generate(ids, max_new_tokens=12).sequences
    right = ar.tolist()
    # Row 0 drafts 6 right tokens; row 1 drafts 2 right tokens whose padding equals AR's third token (it must
    # not count); row 2 drafts nothing.
    drafter = FixedChains([right[0][:6], right[1][:2], []])
    drafter.tokens[1, 2:] = right[1][2]
    out = SpeculativeDecoder(HFCausalLM(target), drafter, GreedyMatch(), GREEDY, num_draft_tokens=6).generate(
        ids, max_new_tokens=12)
    assert torch.equal(out.sequences, ar)
    # Steps per row: 1 + (12 − 7) for row 0, 1 + (12 − 3) for row 1 (its padding was not accepted), 12 for row 2.
    assert out.stats.row_steps == 6 + 10 + 12
    assert out.stats.drafted_per_position[:3] == [2, 2, 1] and out.stats.accepted_per_position[:3] == [2, 2, 1]
