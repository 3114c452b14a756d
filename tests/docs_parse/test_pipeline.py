"""DocParsePipeline on a tiny random GOT-OCR2: modes, batching, determinism, persistence, clear errors, and the
bench's decoding of sequences back into markdown."""

import numpy as np
import pytest
import torch

from mmspec.docs_parse.model import PagePrompts, tiny_got_config, train_tokenizer
from mmspec.docs_parse.pages import PAGE_SIZE, page_markdown, render_page
from mmspec.docs_parse.pipeline import DocParsePipeline, ParsedBlock, load_page
from mmspec.docs_parse.structure import PAGES, REGIONS, PageRegions


@pytest.fixture(scope="module")
def pipe():
    from transformers import GotOcr2ForConditionalGeneration

    tokenizer = train_tokenizer([page_markdown(render_page(s, augment=False).blocks) for s in range(30)],
                                vocab_size=300)
    torch.manual_seed(0)
    config = tiny_got_config(vocab_size=len(tokenizer), image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                             text_hidden=64, text_layers=2, vision_hidden=32, vision_layers=2)
    model = GotOcr2ForConditionalGeneration(config)
    with torch.no_grad():  # random image features barely move a random decoder: make the page matter
        model.model.multi_modal_projector.multimodal_projector.weight.mul_(50)
    return DocParsePipeline(model, tokenizer)


@pytest.fixture(scope="module")
def pages():
    return [render_page(s, "test").image for s in range(3)]


def gens(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


@pytest.mark.parametrize("mode", ["page", "layout"])
def test_a_batch_equals_its_pages_one_by_one_under_sampling(pipe, pages, mode):
    settings = dict(mode=mode, max_new_tokens=10, temperature=1.0)
    together = pipe(pages, batch_size=3, generator=gens(3), **settings)
    alone = [pipe(p, generator=g, **settings) for p, g in zip(pages, gens(3))]
    assert together.sequences == [a.sequences[0] for a in alone]
    assert [len(s) for s in together.sequences] == [10, 10, 10]  # a random model does not stop
    assert together.finished == [False] * 3
    assert together.stats.extra[PAGES] == 3


def test_region_prompts_of_a_batch_equal_each_page_alone_and_read_their_own_page(pipe, pages):
    boxes = [[(10, 10, 200, 60), (10, 80, 300, 200)], [(0, 0, 320, 320)], [(50, 50, 100, 100), (5, 5, 20, 20),
                                                                              (100, 150, 300, 310)]]
    settings = dict(mode="regions", max_new_tokens=6, temperature=1.0)
    together = pipe(pages, regions=boxes, batch_size=3, generator=gens(3, 7), **settings)
    alone = [pipe([p], regions=[b], generator=[g], **settings) for p, b, g in zip(pages, boxes, gens(3, 7))]
    assert together.sequences == [a.sequences[0] for a in alone]
    assert together.stats.extra[REGIONS] == 6
    assert [[b.box for b in blocks] for blocks in together.blocks] == boxes
    assert all(b.type is None and isinstance(b.markdown, str) for blocks in together.blocks for b in blocks)
    # the same box on another page reads other features: the rows do not share one page by mistake
    settings["max_new_tokens"] = 12
    swapped = pipe([pages[1], pages[0]], regions=[[boxes[0][0]], [boxes[0][0]]], generator=gens(1, 5) + gens(1, 5),
                   **settings)
    first = pipe([pages[0]], regions=[[boxes[0][0]]], generator=gens(1, 5), **settings)
    assert swapped.sequences[1] == first.sequences[0]
    assert swapped.sequences[0] != first.sequences[0]


def test_greedy_is_deterministic_and_a_saved_pipeline_reloads_to_the_same_output(pipe, pages, tmp_path):
    first = pipe(pages[:2], max_new_tokens=8)
    assert pipe(pages[:2], max_new_tokens=8, batch_size=1).sequences == first.sequences
    pipe.save_pretrained(tmp_path)
    again = DocParsePipeline.from_pretrained(tmp_path)
    assert again(pages[:2], max_new_tokens=8).sequences == first.sequences


def test_boxes_come_back_in_the_input_image_s_pixels(pipe, pages):
    big = pages[0].resize((640, 960))
    out = pipe([big], regions=[[(20, 30, 600, 900)]], mode="regions", max_new_tokens=2)
    assert out.blocks[0][0].box == (20, 30, 600, 900)


def test_inputs_of_every_kind_read_as_the_same_page(pipe, pages, tmp_path):
    image = pages[0]
    path = tmp_path / "page.png"
    image.save(path)
    grey = np.asarray(image)
    reference = load_page(image)
    for item in (str(path), grey, grey.astype(np.float32) / 255, torch.from_numpy(grey.copy()),
                 torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1)):
        assert np.array_equal(np.asarray(load_page(item)), np.asarray(reference))


@pytest.mark.parametrize("call, message", [
    (dict(mode="markdown"), "mode must be one of"),
    (dict(mode="page", regions=[[(0, 0, 5, 5)]]), "regions= boxes go with mode='regions'"),
    (dict(mode="regions"), "mode='regions' needs them"),
    (dict(mode="regions", regions=[[(0, 0, 400, 50)]]), r"regions\[0\]\[0\] = \(0, 0, 400, 50\) is not a box inside"),
    (dict(mode="regions", regions=[[(10, 10, 5, 50)]]), "is not a box inside"),
    (dict(mode="regions", regions=[[(1, 2, 3)]]), r"regions\[0\]\[0\] must be 4 numbers"),
    (dict(mode="regions", regions=[]), "one list of boxes per page"),
    (dict(max_new_tokens=0), "max_new_tokens must be an int >= 1"),
    (dict(max_new_tokens=5000), "max_new_tokens must be at most"),
    (dict(batch_size=0), "batch_size must be an int >= 1"),
    (dict(temperature=-1.0), "temperature must be"),
    (dict(generator=[torch.Generator()] * 2), "got 2 generators for 1 pages"),
    (dict(mode="layout+regions", stream="yes"), "stream must be None, True or False, got 'yes'"),
    (dict(mode="page", stream=True), "stream= goes with mode='layout\\+regions'"),
])
def test_bad_calls_fail_with_one_clear_line(pipe, pages, call, message):
    with pytest.raises(ValueError, match=message):
        pipe([pages[0]], **call)


def test_stream_true_needs_a_plugin_that_admits_rows(pipe, pages, monkeypatch):
    from mmspec.common.decoder import SpeculativeDecoder

    monkeypatch.setattr(SpeculativeDecoder, "refill_blocker", lambda self: "it never admits rows")
    with pytest.raises(ValueError, match="stream=True needs a plugin that admits rows .* but it never admits rows"):
        pipe([pages[0]], mode="layout+regions", stream=True)
    out = pipe([pages[0]], mode="layout+regions", max_new_tokens=5)  # None: the two passes, one after another
    assert "streamed_calls" not in out.stats.extra


def test_bad_pages_fail_with_one_clear_line(pipe, tmp_path):
    from PIL import Image

    with pytest.raises(ValueError, match=r"images\[0\]: the page is 20×200 pixels"):
        pipe([Image.new("L", (20, 200))])
    with pytest.raises(ValueError, match=r"images\[1\]: the page is 1×1 pixels"):
        pipe([Image.new("L", (64, 64)), np.zeros((1, 1), dtype=np.uint8)])
    with pytest.raises(ValueError, match=r"the page array is empty \(shape \(0, 0\)\)"):
        pipe(np.zeros((0, 0), dtype=np.uint8))
    with pytest.raises(FileNotFoundError, match="no such PDF file"):
        pipe(str(tmp_path / "paper.pdf"))
    with pytest.raises(FileNotFoundError, match="no such image file"):
        pipe(str(tmp_path / "missing.png"))
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(ValueError, match="is not an image PIL can read"):
        pipe(str(tmp_path / "notes.png"))
    with pytest.raises(ValueError, match="finite values in"):
        pipe(np.full((64, 64), 2.0))
    with pytest.raises(ValueError, match="H×W"):
        pipe(np.zeros((2, 64, 64, 3), dtype=np.uint8))
    with pytest.raises(TypeError, match="expected a file path"):
        pipe(42)
    with pytest.raises(ValueError, match="images is an empty list"):
        pipe([])


def test_every_bad_page_is_named_in_one_error_before_any_model_work(pipe, pages, tmp_path, monkeypatch):
    from PIL import Image

    import mmspec.docs_parse.pipeline as doc_pipeline

    def no_model_work(*args, **kwargs):
        raise AssertionError("the model ran before the pages were checked")

    monkeypatch.setattr(doc_pipeline, "encode_pages", no_model_work)
    monkeypatch.setattr(pipe, "decode", no_model_work)
    (tmp_path / "notes.png").write_text("not an image")
    missing, notes = str(tmp_path / "missing.png"), str(tmp_path / "notes.png")
    with pytest.raises(ValueError) as caught:
        pipe([pages[0], missing, pages[1], notes, Image.new("L", (20, 200)), str(tmp_path / "paper.pdf")])
    message = str(caught.value)
    assert message.startswith(f"images: 4 of 6 inputs cannot be used: images[1]: no such image file {missing!r}; "
                              f"images[3]: {notes!r} is not an image PIL can read (")
    assert message.endswith("; images[4]: the page is 20×200 pixels; both sides must be at least 32; "
                            f"images[5]: no such PDF file {str(tmp_path / 'paper.pdf')!r}")
    assert "\n" not in message
    with pytest.raises(FileNotFoundError, match=r"^images: 2 of 3 inputs .*images\[0\]: .*; images\[2\]: no such"):
        pipe([missing, pages[0], str(tmp_path / "paper.pdf")])
    with pytest.raises(ValueError, match=r"^pdf_dpi must be an int in \[36, 1200\], got 10$"):  # once, not per PDF
        pipe([str(tmp_path / "a.pdf"), str(tmp_path / "b.pdf")], pdf_dpi=10)


def test_page_progress_is_a_line_per_batch_off_a_terminal(pipe, pages, capfd):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # max_new_tokens=2 cuts every page; its warning would print on stderr
        pipe([pages[0], pages[1], pages[2]], batch_size=2, max_new_tokens=2)
    lines = capfd.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == ["parsing: batch 1/2: 2/3 pages", "parsing: batch 2/2: 3/3 pages"]


def test_pdf_pages_are_read_whole_or_by_index(pipe, pages, tmp_path):
    from mmspec.docs_parse import render_pdf

    path = tmp_path / "two.pdf"
    pages[0].save(path, save_all=True, append_images=[pages[1]], resolution=72.0)  # 320 pt = 320 px at 72 dpi
    rendered = render_pdf(path, dpi=72)
    assert [p.size for p in rendered] == [(320, 320), (320, 320)]
    assert np.abs(np.asarray(rendered[1].convert("L"), dtype=int) - np.asarray(pages[1], dtype=int)).mean() < 8
    whole = pipe([str(path), pages[2]], max_new_tokens=4, pdf_dpi=72)
    assert whole.sources == ["images[0] page 0", "images[0] page 1", "images[1]"]
    one = pipe([(str(path), 1)], max_new_tokens=4, pdf_dpi=72)
    assert one.sources == ["images[0] page 1"] and one.sequences[0] == whole.sequences[1]
    with pytest.raises(ValueError, match=r"images\[0\]: page index 2 is out of range; .* has 2 pages \(indices 0–1\)"):
        pipe([(str(path), 2)])
    with pytest.raises(ValueError, match="got 2 generators for 3 pages"):
        pipe([str(path), pages[2]], generator=gens(2))
    (tmp_path / "bad.pdf").write_text("not a pdf")
    with pytest.raises(ValueError, match="is not a PDF PDFium can read"):
        pipe(str(tmp_path / "bad.pdf"))


def test_bench_quality_reads_sequences_of_every_mode_back_into_markdown(pipe):
    """Sequences built from the ground truth score perfectly: page mode, regions mode, layout mode."""
    prompts: PagePrompts = pipe.prompts
    eos = prompts.eos_token_id
    rows = [{"markdown": p.markdown, "blocks": p.blocks} for p in (render_page(s, "test") for s in range(4))]
    page_mode = [prompts.text_ids(r["markdown"]) + [eos] for r in rows]
    regions_mode = [prompts.layout_ids(r["blocks"]) + [eos]
                    + [t for b in r["blocks"] for t in prompts.text_ids(b.content) + [eos]] for r in rows]
    layout_mode = [prompts.layout_ids(r["blocks"]) + [eos] for r in rows]
    for sequences in (page_mode, regions_mode):
        quality = pipe.bench_quality(rows, sequences)
        assert quality["text_ned"] == 0.0
        assert quality.get("table_teds", 1.0) == 1.0 and quality.get("formula_exact", 1.0) == 1.0
    assert pipe.bench_quality(rows, regions_mode)["layout_f1"] == 1.0
    layout = pipe.bench_quality(rows, layout_mode)
    assert "text_ned" not in layout and layout["layout_f1"] == 1.0 and layout["reading_order_ned"] == 0.0
    # a wrong page is scored as wrong
    assert pipe.bench_quality(rows, page_mode[1:] + page_mode[:1])["text_ned"] > 0.5


def test_the_structure_names_its_pass():
    assert PageRegions("region", 3).describe() == "PageRegions(region, 3 regions)"
    with pytest.raises(ValueError, match="task must be one of"):
        PageRegions("table")
    assert ParsedBlock("title", (0, 0, PAGE_SIZE, 10), "# x").markdown == "# x"


# --- a real GOT-OCR2 checkpoint's own prompts (GotOcr2Processor) --------------------------------------------

@pytest.fixture(scope="module")
def got_native():
    from transformers import GotOcr2ForConditionalGeneration, GotOcr2ImageProcessor, GotOcr2Processor

    tokenizer = train_tokenizer([page_markdown(render_page(s, augment=False).blocks) for s in range(30)],
                                vocab_size=300)
    tokenizer.add_tokens(["<|im_start|>", "<|im_end|>", "<img>", "</img>", "<imgpad>"], special_tokens=True)
    processor = GotOcr2Processor(GotOcr2ImageProcessor(size={"height": PAGE_SIZE, "width": PAGE_SIZE}), tokenizer)
    torch.manual_seed(1)
    config = tiny_got_config(vocab_size=len(tokenizer), image_token_id=processor.image_token_id,
                             text_hidden=64, text_layers=2, vision_hidden=32, vision_layers=2)
    model = GotOcr2ForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.model.multi_modal_projector.multimodal_projector.weight.mul_(50)
    return DocParsePipeline.from_got_ocr2(model, processor), model, processor


def test_a_got_ocr2_checkpoint_runs_with_its_own_prompts_and_equals_its_generate(got_native, pages, tmp_path):
    pipe, model, processor = got_native
    eos = pipe.prompts.eos_token_id
    boxes = [(10, 10, 200, 60), (5, 100, 315, 300)]  # prompts of different lengths: left padding
    out = pipe(pages[:2], max_new_tokens=10)
    regions = pipe([pages[0]], mode="regions", regions=[boxes], max_new_tokens=10)
    with torch.no_grad():
        for i, page in enumerate(pages[:2]):
            inputs = processor(images=page, format=True, num_image_tokens=64, return_tensors="pt")
            ref = model.generate(**inputs, max_new_tokens=10, do_sample=False, eos_token_id=eos, pad_token_id=eos)
            assert out.sequences[i] == ref[0, inputs["input_ids"].shape[1]:].tolist()
        got = [regions.sequences[0][:10], regions.sequences[0][10:]]
        assert len(set(len(pipe.prompts.prompt("region", b)) for b in boxes)) == 2
        for box, ours in zip(boxes, got):
            inputs = processor(images=pages[0], box=list(box), format=True, num_image_tokens=64, return_tensors="pt")
            ref = model.generate(**inputs, max_new_tokens=10, do_sample=False, eos_token_id=eos, pad_token_id=eos)
            assert ours == ref[0, inputs["input_ids"].shape[1]:].tolist()
    with pytest.raises(ValueError, match="needs a layout pass, which this model has no prompt for"):
        pipe([pages[0]], mode="layout+regions")
    pipe.save_pretrained(tmp_path)
    again = DocParsePipeline.from_pretrained(tmp_path)
    assert isinstance(again.prompts, type(pipe.prompts))
    assert again(pages[:2], max_new_tokens=10).sequences == out.sequences
    # ptp on the checkpoint (untrained registers with adapters: exactness, not speed), pages and regions
    from mmspec import load_plugin
    from register_helpers import random_registers

    random_registers(model, 4, "model.language_model.layers").save_pretrained(tmp_path / "registers")
    ptp = load_plugin("ptp", pipeline=pipe, num_draft_tokens=4, registers_path=str(tmp_path / "registers"))
    assert ptp(pages[:2], max_new_tokens=10).sequences == out.sequences
    assert ptp([pages[0]], mode="regions", regions=[boxes], max_new_tokens=10).sequences == regions.sequences
    with pytest.raises(ValueError, match="needs a layout pass"):
        ptp([pages[0]], mode="layout+regions")
