"""Image-generation adapters for transformers' Janus, Emu3 and Chameleon, on tiny random models.

Each adapter's greedy decode through `SpeculativeDecoder` must reproduce the model's own image
generation: Janus's `generate(generation_mode="image")` (with its built-in CFG), Emu3's
`generate` constrained to visual tokens with EOL at row ends (its documented
`prefix_allowed_tokens_fn`, with and without a negative prompt), and for Chameleon, whose
transformers forward masks all image tokens, a hand-written loop of full forward passes.
"""

import pytest
import torch

from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.draft import DraftModelDrafter
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import CFGModel
from mmspec.common.tree import TreeSpec
from mmspec.vision.hf_adapters import ChameleonImageAdapter, Emu3ImageAdapter, JanusImageAdapter

from tiny_models import (  # tests/ is on pythonpath
    HF_CODES as CODES, HF_GRID as GRID, JANUS_BOI as BOI, build_tiny_chameleon, build_tiny_emu3, build_tiny_janus,
    shuffled_image_ids as _image_ids,
)

GREEDY = LogitsPipeline(temperature=0)
# The tiny models (tests/tiny_models.py): codebook CODES, GRID x GRID images, Janus's <begin_of_image> is BOI;
# Emu3 / Chameleon image tokens are LM ids 40.. (after the text vocabulary), shuffled.


def perturbed(build, noise=0.15):
    """The same model with noisy weights: a draft that is right sometimes (ragged acceptance)."""
    draft = build()
    gen = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise * p.std().clamp(min=1e-3))
    return draft


@pytest.fixture(scope="module")
def janus():
    return build_tiny_janus()


@pytest.fixture(scope="module")
def emu3():
    return build_tiny_emu3()


@pytest.fixture(scope="module")
def chameleon():
    return build_tiny_chameleon()


def left_pad(rows, pad=0):
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def generate(adapter, lm_ids, mask=None, n=GRID * GRID, cfg=None, both=None, drafter=None, k=0):
    """Greedy codes from the mmspec loop. both: LM ids and mask of the [cond; uncond] prompts, for CFG."""
    target, prefill = adapter, None
    if cfg is not None:
        target = CFGModel(adapter, cfg)
        prefill = (adapter.prompt_ids(both[0]), both[1])
    decoder = SpeculativeDecoder(target, drafter, logits=GREEDY, num_draft_tokens=k)
    return decoder.generate(adapter.prompt_ids(lm_ids), mask, max_new_tokens=n, prefill_input=prefill)


# --- Janus -----------------------------------------------------------------------------------------

JANUS_PROMPTS = [[1, 10, 11, 12, 13, 7, BOI], [1, 20, 9, BOI]]


def janus_both(adapter, ids, mask=None):
    """[cond; uncond] LM ids as Janus's generate builds them; cfg_prefill_input gives the same in adapter ids."""
    mask = torch.ones_like(ids) if mask is None else mask
    prefill = adapter.cfg_prefill_input(ids, mask)
    both = (torch.cat([ids, adapter.unconditional_ids(ids)]), torch.cat([mask, mask]))
    assert torch.equal(prefill[0], adapter.prompt_ids(both[0])) and torch.equal(prefill[1], both[1])
    return both


@pytest.mark.parametrize("scale", [2.0, 5.0])
def test_janus_cfg_matches_its_image_generate(janus, scale):
    """Batch of 2 prompts of different lengths (left padded) vs Janus's own CFG loop, and per row."""
    adapter = JanusImageAdapter(janus)
    ids, mask = left_pad(JANUS_PROMPTS)
    expected = janus.generate(ids, attention_mask=mask, generation_mode="image", do_sample=False,
                              guidance_scale=scale)
    assert expected.shape == (2, adapter.image_seq_len) and len(set(expected.flatten().tolist())) > 4
    out = generate(adapter, ids, mask, cfg=scale, both=janus_both(adapter, ids, mask))
    assert torch.equal(out.sequences, expected)
    for b, row in enumerate(JANUS_PROMPTS):
        single = torch.tensor([row])
        alone = generate(adapter, single, cfg=scale, both=janus_both(adapter, single))
        assert torch.equal(alone.sequences[0], expected[b])


def janus_reference(model, ids, n=GRID * GRID):
    """No guidance (Janus's generate cannot run with guidance_scale <= 1): full forward passes of the
    language model on [text embeddings; generation embeddings], argmax of generation_head."""
    embeds, codes = model.get_input_embeddings()(ids), []
    with torch.no_grad():
        for _ in range(n):
            hidden = model.model.language_model(inputs_embeds=embeds).last_hidden_state[:, -1]
            code = model.model.generation_head(hidden).argmax(-1)
            codes.append(code)
            embeds = torch.cat([embeds, model.prepare_embeddings_for_image_generation(code[:, None])], 1)
    return torch.stack(codes, 1)


def test_janus_without_guidance_matches_full_forward_reference(janus):
    adapter = JanusImageAdapter(janus)
    ids, mask = left_pad(JANUS_PROMPTS)
    batched = generate(adapter, ids, mask)
    for b, row in enumerate(JANUS_PROMPTS):
        expected = janus_reference(janus, torch.tensor([row]))
        assert len(set(expected.flatten().tolist())) > 4
        assert torch.equal(batched.sequences[b], expected[0])


def test_janus_unconditional_prompt_keeps_bos_and_boi(janus):
    adapter = JanusImageAdapter(janus)
    assert adapter.unconditional_ids(torch.tensor([[1, 10, 11, BOI]])).tolist() == [[1, 0, 0, BOI]]
    assert adapter.vocab_size == CODES and adapter.prompt_ids(torch.tensor([3])).item() == CODES + 3


# --- Emu3 ------------------------------------------------------------------------------------------

# Emu3's image prompts end with "<|image start|>H*W<|image token|>"; 33 is <|image token|> here.
EMU3_PROMPTS = [[1, 11, 12, 13, 14, 15, 16, 33], [1, 17, 18, 33]]
EMU3_NEGATIVE = [[1, 19, 33], [1, 20, 21, 22, 23, 33]]


def emu3_reference(model, adapter, ids, mask, width=GRID, height=GRID, negative=None, scale=None):
    """Emu3's own generate, constrained as in its docs: visual tokens, EOL after every row; -> codes."""
    visual = adapter.code_ids.tolist()
    eol = adapter.eol_token_id
    start = ids.shape[1]

    def allowed(batch_id, seq):
        return [eol] if (seq.shape[0] - start + 1) % (width + 1) == 0 else visual

    kwargs = {}
    if negative is not None:
        kwargs = dict(negative_prompt_ids=negative[0], negative_prompt_attention_mask=negative[1],
                      guidance_scale=scale)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=height * (width + 1), do_sample=False,
                         prefix_allowed_tokens_fn=allowed, pad_token_id=0, eos_token_id=None, **kwargs)
    grid = out[:, start:].view(ids.shape[0], height, width + 1)
    assert bool((grid[..., -1] == eol).all())
    return adapter.lm_ids_to_codes(grid[..., :-1].reshape(ids.shape[0], -1))


def test_emu3_matches_constrained_generate(emu3):
    adapter = Emu3ImageAdapter(emu3, width=GRID)
    for row in EMU3_PROMPTS:
        ids = torch.tensor([row])
        expected = emu3_reference(emu3, adapter, ids, torch.ones_like(ids))
        assert len(set(expected.flatten().tolist())) > 4
        assert torch.equal(generate(adapter, ids).sequences, expected)


def test_emu3_cfg_matches_negative_prompt_generate(emu3):
    """Emu3's documented CFG: generate(negative_prompt_ids=..., guidance_scale=s), one prompt at a time."""
    adapter = Emu3ImageAdapter(emu3, width=GRID)
    for row, neg in zip(EMU3_PROMPTS, EMU3_NEGATIVE):
        ids, neg_ids = torch.tensor([row]), torch.tensor([neg])
        expected = emu3_reference(emu3, adapter, ids, torch.ones_like(ids),
                                  negative=(neg_ids, torch.ones_like(neg_ids)), scale=3.0)
        both, both_mask = left_pad([row, neg])
        assert torch.equal(generate(adapter, ids, cfg=3.0, both=(both, both_mask)).sequences, expected)


def test_emu3_ragged_batch_and_non_square_grid(emu3):
    adapter = Emu3ImageAdapter(emu3, width=3)
    ids, mask = left_pad(EMU3_PROMPTS)
    batched = generate(adapter, ids, mask, n=6)
    for b, row in enumerate(EMU3_PROMPTS):
        single = torch.tensor([row])
        expected = emu3_reference(emu3, adapter, single, torch.ones_like(single), width=3, height=2)
        assert torch.equal(batched.sequences[b], expected[0])
    # CFG with unconditional prompts of other lengths than the conditional ones.
    both, both_mask = left_pad(EMU3_PROMPTS + EMU3_NEGATIVE)
    cfg = generate(adapter, ids, mask, n=6, cfg=2.0, both=(both, both_mask))
    for b in range(2):
        alone = generate(adapter, ids[b:b + 1, mask[b].bool()], n=6, cfg=2.0,
                         both=left_pad([EMU3_PROMPTS[b], EMU3_NEGATIVE[b]]))
        assert torch.equal(cfg.sequences[b], alone.sequences[0])


@pytest.mark.parametrize("tree", [None, [2, 2, 1]])
def test_emu3_speculative_crop_keep_select_rows(emu3, tree):
    """A noisy draft model: ragged acceptance rolls rows back across row ends (EOLs), output unchanged.
    compact_slack=2 makes the target gather its live KV slots (LM positions, EOLs included) often."""
    adapter = Emu3ImageAdapter(emu3, width=GRID, compact_slack=2)
    drafter = DraftModelDrafter(Emu3ImageAdapter(perturbed(build_tiny_emu3), width=GRID),
                                tree=None if tree is None else TreeSpec.full(tree))
    ids, mask = left_pad(EMU3_PROMPTS)
    plain = generate(adapter, ids, mask)
    spec = generate(adapter, ids, mask, drafter=drafter, k=0 if tree else 3)
    assert torch.equal(spec.sequences, plain.sequences)
    assert 1 < spec.stats.target_nfe < GRID * GRID


# --- Chameleon -------------------------------------------------------------------------------------

CHAMELEON_PROMPTS = [[1, 11, 12, 13, 14, 15, 8], [1, 16, 8]]


def chameleon_reference(model, ids, n=GRID * GRID):
    """Full forward passes of the decoder + LM head, argmax over the image tokens (no cache)."""
    image_ids = torch.tensor(model.model.vocabulary_mapping.image_tokens)
    bpe2img = model.model.vocabulary_mapping.bpe2img
    seq, codes = ids, []
    with torch.no_grad():
        for _ in range(n):
            hidden = model.model(input_ids=seq).last_hidden_state[:, -1]
            best = image_ids[model.lm_head(hidden)[:, image_ids].argmax(-1)]
            codes.append([bpe2img[int(t)] for t in best])
            seq = torch.cat([seq, best[:, None]], 1)
    return torch.tensor(codes).T


def test_chameleon_matches_full_forward_reference(chameleon):
    adapter = ChameleonImageAdapter(chameleon)
    ids, mask = left_pad(CHAMELEON_PROMPTS)
    batched = generate(adapter, ids, mask)
    for b, row in enumerate(CHAMELEON_PROMPTS):
        expected = chameleon_reference(chameleon, torch.tensor([row]))
        assert torch.equal(batched.sequences[b], expected[0])
    assert len(set(batched.sequences.flatten().tolist())) > 4


def test_chameleon_forward_masks_image_tokens(chameleon):
    """Why the adapter reads lm_head itself: transformers' Chameleon forbids image tokens in its logits."""
    logits = chameleon(input_ids=torch.tensor([CHAMELEON_PROMPTS[0]])).logits
    image_ids = chameleon.model.vocabulary_mapping.image_tokens
    assert bool((logits[..., image_ids] == torch.finfo(logits.dtype).min).all())


def test_chameleon_speculative_and_code_mapping(chameleon):
    adapter = ChameleonImageAdapter(chameleon)
    codes = torch.arange(CODES)
    assert torch.equal(adapter.lm_ids_to_codes(adapter.codes_to_lm_ids(codes)), codes)
    assert adapter.codes_to_lm_ids(codes).tolist() == _image_ids()
    ids, mask = left_pad(CHAMELEON_PROMPTS)
    drafter = DraftModelDrafter(ChameleonImageAdapter(perturbed(build_tiny_chameleon)))
    spec = generate(adapter, ids, mask, drafter=drafter, k=3)
    assert torch.equal(spec.sequences, generate(adapter, ids, mask).sequences)
    assert spec.stats.target_nfe < GRID * GRID


def test_bad_arguments(emu3):
    with pytest.raises(ValueError, match="width"):
        Emu3ImageAdapter(emu3, width=0)
