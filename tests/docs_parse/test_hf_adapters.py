"""Idefics3 (SmolDocling) and Florence-2 adapters: greedy through the core equals each model's own generate.

The models are tiny random ones built from configs (no Hub). Their end-of-sequence token is picked from
what they generate, so that it ends some rows early and not others: the core then drops finished rows
mid-decode (select_rows), which is where an adapter's per-row state goes wrong first.
"""

import pytest
import torch

from mmspec.common.logits import LogitsPipeline
from mmspec.common.registry import get_plugin_class
from mmspec.docs_parse.hf import Florence2AR, Idefics3AR, encode_florence2, encode_idefics3_pages
from request_helpers import build_decoder
from tiny_models import perturbed_copy

VOCAB = 64
IMAGE, FAKE_AROUND_IMAGE = 60, 61  # Idefics3's <image> and <fake_token_around_image>; Florence-2's <image>
MAX_NEW = 14


def core_greedy(target, input_ids, attention_mask, eos, pad, max_new_tokens=MAX_NEW):
    """Plain autoregressive greedy decoding through the core: the `ar` plugin's decoder over `target`."""
    decoder = build_decoder(get_plugin_class("ar")(), target, LogitsPipeline(temperature=0.0),
                            eos_token_id=eos, pad_token_id=pad)
    return decoder.generate(input_ids, attention_mask, max_new_tokens=max_new_tokens).tolist()


def core_speculative_greedy(target, draft, input_ids, attention_mask, eos, pad, max_new_tokens=MAX_NEW):
    """Greedy speculative decoding (`speculative` plugin, chains of 3 drafts): -> (tokens, accepted_hist).

    Ragged acceptance is what ties an adapter to the core: rows sit at different positions, the cache is
    cropped back after every verify, and (with compact_slack=0 on the target) dead slots are compacted away."""
    decoder = build_decoder(get_plugin_class("speculative")(num_draft_tokens=3), target,
                            LogitsPipeline(temperature=0.0), eos_token_id=eos, pad_token_id=pad, draft_model=draft)
    out = decoder.generate(input_ids, attention_mask, max_new_tokens=max_new_tokens)
    return out.tolist(), out.stats.accepted_hist


def core_ptp_greedy(target, input_ids, attention_mask, eos, pad, adapter_under, max_new_tokens=MAX_NEW):
    """Greedy `ptp` (k = 3) with untrained registers (and gated adapters) for `target`'s model."""
    from mmspec.plugins.ptp import PTPDecoder
    from register_helpers import random_registers

    registers = random_registers(target.model, 3, adapter_under)
    decoder = PTPDecoder(target, registers, LogitsPipeline(temperature=0.0), 3, eos_token_id=eos, pad_token_id=pad)
    return decoder.generate(input_ids, attention_mask, max_new_tokens=max_new_tokens).tolist()


def assert_acceptance_was_ragged(accepted_hist):
    """Some steps committed one token (draft rejected at once), some more: the crop paths ran."""
    assert accepted_hist[1] > 0 and sum(accepted_hist[2:]) > 0, accepted_hist


def eos_that_ends_only_some_rows(sequences):
    """A token that first appears after step 0 in one row and never in another: as EOS, rows end ragged."""
    for row in sequences:
        for step in range(1, len(row)):
            token = row[step]
            if token not in row[:step] and any(token not in other for other in sequences):
                return token
    raise AssertionError(f"no token ends some rows but not others in {sequences}: change the seed")


def cut_at(tokens, eos):
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def left_padded(rows, pad):
    longest = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (longest - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


# --- Idefics3 ---------------------------------------------------------------------------------------------

IDEFICS_PAD, IDEFICS_BOS = 0, 1


@pytest.fixture(scope="module")
def idefics3():
    """SigLIP 32 px / 8 px patches, pixel shuffle ×2: 4 features per sub-image; Llama text, hidden 64."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    torch.manual_seed(0)
    config = Idefics3Config(
        image_token_id=IMAGE, scale_factor=2,
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        text_config=dict(model_type="llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, pad_token_id=IDEFICS_PAD, bos_token_id=IDEFICS_BOS,
                         eos_token_id=None))
    return Idefics3ForConditionalGeneration(config).eval()


def idefics3_prompt(model, sub_images: int, text: list[int]) -> list[int]:
    """<bos> (<fake> <image>×n) per sub-image <fake> text: the processor's layout, less its row/col tags."""
    per_image = [FAKE_AROUND_IMAGE] + [IMAGE] * model.model.image_seq_len
    return [IDEFICS_BOS] + per_image * sub_images + [FAKE_AROUND_IMAGE] + text


@pytest.fixture(scope="module")
def idefics3_pages():
    """Two pages as the processor hands them over, [pages, sub-images, C, H, W]: page 0 split into two
    sub-images, page 1 a single one (its second slot is zero padding)."""
    pixels = torch.randn(2, 2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    pixels[1, 1] = 0
    return pixels, [2, 1]


# Rows 0 and 1 read page 0 (two prompts over one encoder pass), row 2 reads page 1; prompt lengths differ.
IDEFICS3_ROWS = [(0, [5, 6, 7]), (0, [9, 10, 11, 12, 13]), (1, [20])]


def idefics3_generate(model, prompts, pixels, eos):
    """The model's own greedy generate, one row at a time from its raw page pixels, cut after EOS."""
    out = []
    for (page, _), ids in zip(IDEFICS3_ROWS, prompts):
        ref = model.generate(input_ids=torch.tensor([ids]), pixel_values=pixels[page:page + 1],
                             max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos, pad_token_id=IDEFICS_PAD)
        out.append(cut_at(ref[0, len(ids):].tolist(), eos))
    return out


def test_greedy_through_the_core_equals_idefics3_generate_with_a_page_shared_by_two_rows(idefics3, idefics3_pages):
    model = idefics3
    pixels, sub_images = idefics3_pages
    prompts = [idefics3_prompt(model, sub_images[page], text) for page, text in IDEFICS3_ROWS]
    input_ids, mask = left_padded(prompts, IDEFICS_PAD)
    with torch.no_grad():
        features = encode_idefics3_pages(model, pixels)
        assert [f.shape[0] for f in features] == [2 * model.model.image_seq_len, model.model.image_seq_len]
        target = Idefics3AR(model, features, torch.tensor([page for page, _ in IDEFICS3_ROWS]))

        eos = eos_that_ends_only_some_rows(core_greedy(target, input_ids, mask, None, IDEFICS_PAD))
        ours = core_greedy(target, input_ids, mask, eos, IDEFICS_PAD)
        assert len({len(r) for r in ours}) > 1, "rows should end at different steps"
        assert ours == idefics3_generate(model, prompts, pixels, eos)


def test_speculative_greedy_with_a_perturbed_idefics3_draft_equals_idefics3_generate(idefics3, idefics3_pages):
    model, draft_model = idefics3, perturbed_copy(idefics3, noise=0.1)
    pixels, sub_images = idefics3_pages
    prompts = [idefics3_prompt(model, sub_images[page], text) for page, text in IDEFICS3_ROWS]
    input_ids, mask = left_padded(prompts, IDEFICS_PAD)
    row_pages = torch.tensor([page for page, _ in IDEFICS3_ROWS])
    with torch.no_grad():
        target = Idefics3AR(model, encode_idefics3_pages(model, pixels), row_pages, compact_slack=0)
        draft = Idefics3AR(draft_model, encode_idefics3_pages(draft_model, pixels), row_pages)
        eos = eos_that_ends_only_some_rows(core_greedy(target, input_ids, mask, None, IDEFICS_PAD))
        ours, accepted_hist = core_speculative_greedy(target, draft, input_ids, mask, eos, IDEFICS_PAD)
        assert_acceptance_was_ragged(accepted_hist)
        assert ours == idefics3_generate(model, prompts, pixels, eos)


def test_ptp_greedy_with_untrained_registers_equals_idefics3_generate(idefics3, idefics3_pages):
    model = idefics3
    pixels, sub_images = idefics3_pages
    prompts = [idefics3_prompt(model, sub_images[page], text) for page, text in IDEFICS3_ROWS]
    input_ids, mask = left_padded(prompts, IDEFICS_PAD)
    with torch.no_grad():
        target = Idefics3AR(model, encode_idefics3_pages(model, pixels), torch.tensor([p for p, _ in IDEFICS3_ROWS]))
        eos = eos_that_ends_only_some_rows(core_greedy(target, input_ids, mask, None, IDEFICS_PAD))
        ours = core_ptp_greedy(target, input_ids, mask, eos, IDEFICS_PAD, "model.text_model.layers")
        assert ours == idefics3_generate(model, prompts, pixels, eos)


def test_idefics3_rows_reading_one_page_see_the_same_image_as_their_own_encoder_pass(idefics3, idefics3_pages):
    """Sharing is exact: a row that reads page 0's features from a shared pass decodes what it decodes alone."""
    model = idefics3
    pixels, sub_images = idefics3_pages
    prompt = idefics3_prompt(model, sub_images[0], [30, 31])
    with torch.no_grad():
        shared = Idefics3AR(model, encode_idefics3_pages(model, pixels), torch.tensor([1, 0, 0]))
        other = idefics3_prompt(model, sub_images[1], [30, 31])
        together = core_greedy(shared, *left_padded([other, prompt, prompt], IDEFICS_PAD), None, IDEFICS_PAD)
        alone_target = Idefics3AR(model, encode_idefics3_pages(model, pixels[:1]), torch.tensor([0]))
        alone = core_greedy(alone_target, torch.tensor([prompt]), None, None, IDEFICS_PAD)
    assert together[1] == together[2] == alone[0]


def test_idefics3_adapter_refuses_prompts_without_their_page_s_image_tokens(idefics3, idefics3_pages):
    model = idefics3
    pixels, _ = idefics3_pages
    with torch.no_grad():
        features = encode_idefics3_pages(model, pixels)
        target = Idefics3AR(model, features, torch.tensor([0]))
        one_sub_image = idefics3_prompt(model, 1, [5, 6])  # page 0 was split in two: 8 features, 4 placeholders
        with pytest.raises(ValueError, match=r"exactly as many <image> tokens .* Expected \[8\], got \[4\]"):
            target.prefill(torch.tensor([one_sub_image]))
        with pytest.raises(ValueError, match="no <image> tokens"):
            target.prefill(torch.tensor([[IDEFICS_BOS, 5, 6, 7]]))
        with pytest.raises(ValueError, match="indices into the 2 pages"):
            Idefics3AR(model, features, torch.tensor([2]))


# --- Florence-2 -------------------------------------------------------------------------------------------

BART_BOS, BART_PAD, BART_EOS = 0, 1, 2


@pytest.fixture(scope="module")
def florence2():
    """DaViT with four one-block stages (stride 32): a 64 px image is 2×2 + 1 pooled = 5 features; BART with
    d_model 32. init_std 0.2: at the default 0.02 a random BART repeats one token whatever it reads."""
    from transformers import Florence2Config, Florence2ForConditionalGeneration

    torch.manual_seed(0)
    config = Florence2Config(
        image_token_id=IMAGE,
        vision_config=dict(depths=(1, 1, 1, 1), embed_dim=(16, 16, 16, 32), num_heads=(1, 1, 1, 2),
                           num_groups=(1, 1, 1, 2), window_size=2, projection_dim=32, max_position_embeddings=8,
                           max_temporal_embeddings=4, drop_path_rate=0.0),
        text_config=dict(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
                         decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                         max_position_embeddings=64, dropout=0.0, init_std=0.2, forced_eos_token_id=None,
                         pad_token_id=BART_PAD, bos_token_id=BART_BOS, eos_token_id=BART_EOS,
                         decoder_start_token_id=BART_EOS))
    return Florence2ForConditionalGeneration(config).eval()


FLORENCE_IMAGE_TOKENS = 5


def florence2_task_prompts(texts):
    """<image>×5 <s> task text </s>, right-padded as the processor pads: [E, S] ids and mask."""
    rows = [[IMAGE] * FLORENCE_IMAGE_TOKENS + [BART_BOS] + t + [BART_EOS] for t in texts]
    longest = max(len(r) for r in rows)
    ids = torch.tensor([r + [BART_PAD] * (longest - len(r)) for r in rows])
    return ids, (ids != BART_PAD).long()


@pytest.fixture(scope="module")
def florence2_batch():
    """Two task prompts over page 0 and one over page 1; ragged prompt lengths exercise the encoder mask."""
    pages = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    return pages[[0, 0, 1]], *florence2_task_prompts([[10, 11], [12, 13, 14, 15, 16], [17]])


def florence2_generate(model, pixels, input_ids, attention_mask, eos):
    """The model's own greedy generate over the batch, without its decoder start token, cut after EOS."""
    ref = model.generate(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixels,
                         max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=eos, pad_token_id=BART_PAD)
    assert ref[:, 0].tolist() == [BART_EOS] * ref.shape[0]
    return [cut_at(r, eos) for r in ref[:, 1:].tolist()]


def test_greedy_through_the_core_equals_florence2_generate(florence2, florence2_batch):
    model = florence2
    pixels, input_ids, attention_mask = florence2_batch
    with torch.no_grad():
        states, encoder_mask = encode_florence2(model, pixels, input_ids, attention_mask)
        target = Florence2AR(model, states, encoder_mask)
        prompt = target.decoder_prompt()
        assert prompt.tolist() == [[BART_EOS]] * 3  # BART starts decoding from </s>

        eos = eos_that_ends_only_some_rows(core_greedy(target, prompt, None, None, BART_PAD))
        ours = core_greedy(target, prompt, None, eos, BART_PAD)
        assert len({len(r) for r in ours}) > 1, "rows should end at different steps"
        assert ours == florence2_generate(model, pixels, input_ids, attention_mask, eos)


def test_speculative_greedy_with_a_perturbed_florence2_draft_equals_florence2_generate(florence2, florence2_batch):
    """All rows start at position 0, so only ragged acceptance puts them at different positions: this is the
    test that BART's learned positions follow each row's own position, not the cache length."""
    model, draft_model = florence2, perturbed_copy(florence2, noise=0.1)
    pixels, input_ids, attention_mask = florence2_batch
    with torch.no_grad():
        target = Florence2AR(model, *encode_florence2(model, pixels, input_ids, attention_mask), compact_slack=0)
        draft = Florence2AR(draft_model, *encode_florence2(draft_model, pixels, input_ids, attention_mask))
        prompt = target.decoder_prompt()
        eos = eos_that_ends_only_some_rows(core_greedy(target, prompt, None, None, BART_PAD))
        ours, accepted_hist = core_speculative_greedy(target, draft, prompt, None, eos, BART_PAD)
        assert_acceptance_was_ragged(accepted_hist)
        assert ours == florence2_generate(model, pixels, input_ids, attention_mask, eos)


def test_ptp_greedy_with_untrained_registers_equals_florence2_generate(florence2, florence2_batch):
    model = florence2
    pixels, input_ids, attention_mask = florence2_batch
    with torch.no_grad():
        target = Florence2AR(model, *encode_florence2(model, pixels, input_ids, attention_mask))
        prompt = target.decoder_prompt()
        eos = eos_that_ends_only_some_rows(core_greedy(target, prompt, None, None, BART_PAD))
        ours = core_ptp_greedy(target, prompt, None, eos, BART_PAD, "model.language_model.decoder.layers")
        assert ours == florence2_generate(model, pixels, input_ids, attention_mask, eos)


def test_florence2_encoder_refuses_prompts_with_the_wrong_number_of_image_tokens(florence2):
    pixels = torch.randn(1, 3, 64, 64)
    input_ids, mask = florence2_task_prompts([[10, 11]])
    short = input_ids[:, 1:]  # one placeholder fewer than the image's 5 features
    with torch.no_grad(), pytest.raises(ValueError, match=r"exactly 5 <image> tokens .* got \[4\]"):
        encode_florence2(florence2, pixels, short, mask[:, 1:])
