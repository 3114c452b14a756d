"""The page VLM's prompts and adapter: greedy through the core equals GOT-OCR2's own generate; training resumes."""

import pytest
import torch

from mmspec.common.logits import LogitsPipeline
from mmspec.common.registry import get_plugin_class
from mmspec.docs_parse.model import (LOC_BINS, PageImageProcessor, PagePrompts, PageVLMAR, dequantize_box,
                                     encode_pages, quantize_box, tiny_got_config, train_tokenizer)
from mmspec.docs_parse.pages import PAGE_SIZE, page_markdown, render_page
from request_helpers import build_decoder


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([page_markdown(render_page(s, augment=False).blocks) for s in range(30)], vocab_size=300)


def test_boxes_quantize_to_bins_that_cover_them():
    for box in [(0, 0, PAGE_SIZE, PAGE_SIZE), (14, 97, 299, 125), (3, 4, 5, 6)]:
        bins = quantize_box(box)
        assert all(0 <= b < LOC_BINS for b in bins)
        x0, y0, x1, y1 = dequantize_box(bins)
        assert x0 <= box[0] and y0 <= box[1] and x1 >= box[2] and y1 >= box[3]
        assert x1 - x0 <= box[2] - box[0] + 2 * PAGE_SIZE / LOC_BINS


def test_prompts_round_trip_text_and_layout(tokenizer):
    prompts = PagePrompts(tokenizer, image_seq_length=4)
    page = render_page(2, augment=False)
    ids = prompts.text_ids(page.markdown)
    assert prompts.decode_text(ids + [prompts.eos_token_id]) == page.markdown
    layout = prompts.decode_layout(prompts.layout_ids(page.blocks))
    assert [t for t, _ in layout] == [b.type for b in page.blocks]
    for (_, box), block in zip(layout, page.blocks):
        assert quantize_box(box) == quantize_box(block.box)
    region = prompts.prompt("region", page.blocks[0].box)
    assert region.count(prompts.image_token_id) == 4 and len(region) == 1 + 4 + 1 + 4
    with pytest.raises(ValueError, match="task must be one of"):
        prompts.prompt("summary")


def tiny_model(tokenizer):
    from transformers import GotOcr2ForConditionalGeneration

    torch.manual_seed(0)
    config = tiny_got_config(vocab_size=len(tokenizer), image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                             text_hidden=64, text_layers=2, vision_hidden=32, vision_layers=2)
    return GotOcr2ForConditionalGeneration(config).eval()


def test_greedy_through_the_core_equals_got_ocr2_generate_with_pages_shared_across_rows(tokenizer):
    model = tiny_model(tokenizer)
    prompts = PagePrompts(tokenizer, model.config.image_seq_length)
    pages = [render_page(s, "test") for s in (0, 1)]
    pixels = PageImageProcessor()([p.image for p in pages])
    rows = [(0, prompts.prompt("page")), (0, prompts.prompt("region", pages[0].blocks[1].box)),
            (1, prompts.prompt("layout")), (1, prompts.prompt("region", pages[1].blocks[0].box))]
    eos, pad = prompts.eos_token_id, tokenizer.pad_token_id
    with torch.no_grad():
        features = encode_pages(model, pixels)  # one encoder pass for both pages, four prompts read it
        target = PageVLMAR(model, features, torch.tensor([p for p, _ in rows]), prompts.image_token_id)
        longest = max(len(ids) for _, ids in rows)
        input_ids = torch.tensor([[pad] * (longest - len(ids)) + ids for _, ids in rows])
        mask = torch.tensor([[0] * (longest - len(ids)) + [1] * len(ids) for _, ids in rows])
        decoder = build_decoder(get_plugin_class("ar")(), target, LogitsPipeline(temperature=0.0),
                                eos_token_id=eos, pad_token_id=pad)
        ours = decoder.generate(input_ids, mask, max_new_tokens=24).tolist()
        for (page, ids), got in zip(rows, ours):
            ref = model.generate(input_ids=torch.tensor([ids]), pixel_values=pixels[page:page + 1],
                                 max_new_tokens=24, do_sample=False, eos_token_id=eos, pad_token_id=pad)
            ref = ref[0, len(ids):].tolist()
            if eos in ref:
                ref = ref[: ref.index(eos) + 1]
            assert got == ref


def two_region_pages(tokenizer, per_page: tuple[int, int]):
    """A tiny model, its prompts, the pixels of two held-out pages, and region prompts over their first
    blocks (`per_page` of each): (model, prompts, pixels, [(page, box)], ids)."""
    model = tiny_model(tokenizer)
    prompts = PagePrompts(tokenizer, model.config.image_seq_length)
    pages = [render_page(s, "test") for s in (0, 1)]
    pixels = PageImageProcessor()([p.image for p in pages])
    rows = [(p, b.box) for p, page in enumerate(pages) for b in page.blocks[:per_page[p]]]
    return model, prompts, pixels, rows, torch.tensor([prompts.prompt("region", box) for _, box in rows])


def test_region_prompts_of_one_page_fork_its_prefix_cache_and_equal_whole_prefills(tokenizer):
    """Five region prompts over two pages: the shared prefix runs once per page (two rows), the cache is forked,
    and each row then feeds its box only; greedy decoding equals GOT-OCR2's own generate row by row."""
    from mmspec.common.model import ARModel

    model, prompts, pixels, rows, ids = two_region_pages(tokenizer, (3, 2))
    row_pages = torch.tensor([p for p, _ in rows])
    fed = []
    hook = model.model.language_model.register_forward_pre_hook(
        lambda _, args, kwargs: fed.append(tuple(kwargs["inputs_embeds"].shape[:2])), with_kwargs=True)
    try:
        with torch.no_grad():
            target = PageVLMAR(model, encode_pages(model, pixels), row_pages, prompts.image_token_id)
            forked, _ = target.prefill(ids[:, :-1])
            shared = int((ids[:, :-1] == ids[:1, :-1]).all(0).long().cumprod(0).sum())  # <s> <image>×N <task> ...
            assert shared >= ids.shape[1] - 5  # at least up to the box (boxes may share a first bin)
            assert fed == [(2, shared), (5, ids.shape[1] - 1 - shared)]  # prefix once per page, then the rest
            whole, _ = ARModel.prefill(target, ids[:, :-1])
            positions = torch.full((5, 1), ids.shape[1] - 1)
            step_forked = target.forward(forked, ids[:, -1:], positions).logits
            step_whole = target.forward(whole, ids[:, -1:], positions).logits
            torch.testing.assert_close(step_forked, step_whole, atol=1e-5, rtol=1e-5)
            eos, pad = prompts.eos_token_id, tokenizer.pad_token_id
            decoder = build_decoder(get_plugin_class("ar")(), target, LogitsPipeline(temperature=0.0),
                                    eos_token_id=eos, pad_token_id=pad)
            ours = decoder.generate(ids, max_new_tokens=12).tolist()
    finally:
        hook.remove()
    for (page, _), prompt, got in zip(rows, ids.tolist(), ours):
        ref = model.generate(input_ids=torch.tensor([prompt]), pixel_values=pixels[page:page + 1], max_new_tokens=12,
                             do_sample=False, eos_token_id=eos, pad_token_id=pad)[0, len(prompt):].tolist()
        assert got == (ref[: ref.index(eos) + 1] if eos in ref else ref)


def test_rows_admitted_later_fork_their_page_s_kept_prefix(tokenizer):
    """With shared_prefix, a page's region prefix runs once in whichever prefill first needs it; rows of that
    page admitted by later prefills (continuous batching, streamed regions) feed only their box, and step like
    rows prefilled whole."""
    from mmspec.common.model import ARModel

    model, prompts, pixels, boxes, ids = two_region_pages(tokenizer, (2, 2))
    prefix = 1 + model.config.image_seq_length + 1  # <s> <image>×N <task_region>
    fed = []
    hook = model.model.language_model.register_forward_pre_hook(
        lambda _, args, kwargs: fed.append(tuple(kwargs["inputs_embeds"].shape[:2])), with_kwargs=True)
    rest = ids.shape[1] - 1 - prefix
    try:
        with torch.no_grad():
            target = PageVLMAR(model, encode_pages(model, pixels), torch.tensor([p for p, _ in boxes]),
                               prompts.image_token_id, shared_prefix=prefix)
            for requests, expect in (([0], [(1, prefix), (1, rest)]), ([2, 3], [(1, prefix), (2, rest)]),
                                     ([1], [(1, rest)])):
                fed.clear()
                rows = torch.tensor(requests)
                target.set_prefill_requests(rows)
                forked, _ = target.prefill(ids[rows, :-1])
                assert fed == expect, requests
                whole, _ = ARModel.prefill(target, ids[rows, :-1])
                positions = torch.full((len(requests), 1), ids.shape[1] - 1)
                torch.testing.assert_close(target.forward(forked, ids[rows, -1:], positions).logits,
                                           target.forward(whole, ids[rows, -1:], positions).logits,
                                           atol=1e-5, rtol=1e-5)
    finally:
        hook.remove()


def test_an_image_token_the_model_generates_is_a_plain_token(tokenizer):
    """Sampling (or a draft) can produce the <image> id after the prompt: it is embedded like any token, not
    taken for a misplaced image (which was an error under ptp's sampled drafts)."""
    model = tiny_model(tokenizer)
    prompts = PagePrompts(tokenizer, model.config.image_seq_length)
    pixels = PageImageProcessor()([render_page(0, "test").image])
    prompt = torch.tensor([prompts.prompt("page")])
    image = torch.tensor([[prompts.image_token_id]])
    position = torch.tensor([[prompt.shape[1]]])
    with torch.no_grad():
        target = PageVLMAR(model, encode_pages(model, pixels), torch.tensor([0]), prompts.image_token_id)
        first, _ = target.prefill(prompt)
        second, _ = target.prefill(prompt)
        generated = target.forward(first, image, position).logits
        target.image_token_id = -1  # never a placeholder: the plain embedding of that id
        plain = target.forward(second, image, position).logits
    assert torch.equal(generated, plain)


def test_the_adapter_refuses_a_prompt_without_the_model_s_image_tokens(tokenizer):
    model = tiny_model(tokenizer)
    prompts = PagePrompts(tokenizer, 3)  # the model reads 64 image tokens, the prompt has 3
    with torch.no_grad():
        features = encode_pages(model, PageImageProcessor()([render_page(0).image]))
        target = PageVLMAR(model, features, torch.tensor([0]), prompts.image_token_id)
        with pytest.raises(ValueError, match="exactly 64 <image> tokens"):
            target.prefill(torch.tensor([prompts.prompt("page")]))


@pytest.mark.train
def test_training_smoke_resumes_to_identical_weights(tmp_path):
    from run_example import run_example
    from safetensors.torch import load_file

    common = ["--steps", 4, "--batch-size", 2, "--checkpoint-every", 2, "--tokenizer-pages", 20,
              "--num-validation", 16, "--lr", 3e-3]
    run_example("train_doc_vlm.py", common + ["--work-dir", tmp_path / "a", "--out", tmp_path / "out_a"])
    run_example("train_doc_vlm.py", common + ["--work-dir", tmp_path / "b", "--out", tmp_path / "out_b",
                                              "--stop-after", 2])
    assert not (tmp_path / "out_b").exists()
    run_example("train_doc_vlm.py", common + ["--work-dir", tmp_path / "b", "--out", tmp_path / "out_b"])
    a = load_file(tmp_path / "out_a" / "model.safetensors")
    b = load_file(tmp_path / "out_b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    first = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    assert first["step"] == 4 and first["best"]["loss"] < 8.0  # validation loss from ln(1102) ≈ 7.0 at init
