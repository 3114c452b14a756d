"""`DocParsePipeline`: page images in, markdown out (HTML tables, LaTeX formulas), with any decoding plugin.

    from mmspec import load_plugin
    pipe = load_plugin("ar", model="doc-tiny")
    out = pipe(["page.png", pil_image], mode="layout+regions")
    out.markdown[0], out.blocks[0], out.stats

Modes (`mode=`):
    page            one prompt per page; the model writes the page's markdown in reading order.
    layout          one prompt per page; the model writes typed boxes in reading order (no text).
    layout+regions  the layout pass, and one region prompt per block it finds, all blocks of all pages of a
                    batch decoded as rows of one batch; the markdown is the blocks' text joined in reading
                    order. Where the plugin admits rows into a running decode, a block's row starts as soon
                    as the layout pass has written it (HPD-style streaming, `stream=`); else once the layout
                    pass has ended. Either way the output is the same.
    regions         one region prompt per box you give (`regions=`, one list of boxes per page), no layout.

The vision encoder runs once per page: the layout pass and every region prompt of the page read the same
image features (`PageVLMAR`). Page furniture (page numbers) is kept in `blocks` but left out of `markdown`,
as OmniDocBench scores it.

Inputs: a file path (PNG, JPEG, ...), a PIL image, a numpy array (H×W grey or H×W×3 RGB; uint8, or float in
[0, 1]), a torch tensor (H×W or C×H×W, float in [0, 1] or uint8), a PDF path (every page, rendered at
`pdf_dpi` with pypdfium2) or a ``(pdf_path, page_index)`` pair (one page, 0-based), or a list of them. Output
lists have one entry per page (`DocParseOutput.sources` says where each came from). Pages are resized to the
model's square input (320 px for the bundled model; GOT-OCR2 checkpoints use 1024), so boxes come back in the
input image's own pixels. A call reads all its inputs before any model work and names every bad one in one error.

Randomness: with one generator per page (a list), a page's output depends on its generator only, so a batch
equals its pages one by one; region prompts draw from generators seeded from their page's generator (its
first draw, before the layout pass), so streaming does not change sampled output either. One generator shared
by all pages is drawn from in decode order, which streaming changes.
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..common.decoder import ArrivingRows
from ..common.logits import LogitsPipeline, check_generators
from ..common.loading import load_saved_plugin
from ..common.pipeline import BatchProgress, Pipeline, hand_on_all, load_each, refill_blocker
from ..common.plugin import DecodeRequest
from ..common.stats import DecodeStats
from .model import GotOcr2PixelProcessor, GotOcr2Prompts, PageImageProcessor, PagePrompts, PageVLMAR, encode_pages
from .pages import BLOCK_TYPES
from .structure import PAGES, REGIONS, STREAMED, TIME_LAYOUT, TIME_REGIONS, UNFINISHED_ROWS, PageRegions
from .spec import DOC_SPEC, MODES

BUNDLED_DOC_DIR = Path(__file__).parent / "bundled" / "doc_tiny"
MIN_PAGE_SIDE = 32  # pixels; smaller images carry no readable text
PROCESSOR_FILE = "page_processor.json"  # the bundled format's image settings (a GOT-OCR2 folder has its processor)
FURNITURE = ("page_number",)  # blocks kept in `blocks` but not in a page's markdown
_NOT_REGIONS = object()  # the last bench call was not in regions mode


@dataclass
class ParsedBlock:
    type: str | None  # a layout type (BLOCK_TYPES); None for a region the caller boxed
    box: tuple[int, int, int, int]  # (x0, y0, x1, y1) in the input image's pixels, x1 / y1 exclusive
    markdown: str | None  # None in layout mode (nothing read)


@dataclass
class DocParseOutput:
    markdown: list[str]  # one per page ("" in layout mode)
    blocks: list[list[ParsedBlock]]  # per page, reading order (empty in page mode: the model reads it whole)
    sequences: list[list[int]]  # per page: the pass's tokens; in regions mode the layout tokens (when that pass
    #                             ran) then each region's tokens, every finished prompt ending in </s>
    finished: list[bool]  # False where some prompt of the page hit max_new_tokens before </s>
    stats: DecodeStats = field(default_factory=DecodeStats)
    sources: list[str] = field(default_factory=list)  # per page: "images[i]", or "images[i] page j" of a PDF

    @property
    def pages_per_second(self) -> float:
        return len(self.markdown) / self.stats.time_total_s if self.stats.time_total_s > 0 else 0.0


# --- inputs ------------------------------------------------------------------------------------------------

def _is_pdf(item) -> bool:
    return isinstance(item, (str, os.PathLike)) and str(item).lower().endswith(".pdf")


def expand_inputs(items: list, dpi: int = 150) -> list[tuple[str, Image.Image]]:
    """(source name, RGB page) for every page of the inputs: images as they are, a PDF path as all its pages,
    a (pdf_path, page_index) pair as that page. Every input is read before any error, which names all the bad
    ones (`load_each`)."""
    _check_dpi(dpi)  # a call setting: one error, not one per PDF
    return [page for pages in load_each(items, lambda item, name: _input_pages(item, name, dpi), "images")
            for page in pages]


def _input_pages(item, name: str, dpi: int) -> list[tuple[str, Image.Image]]:
    """One input's pages, named (see `expand_inputs`), each checked for size."""
    if isinstance(item, tuple) and len(item) == 2 and _is_pdf(item[0]):
        path, index = item
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"{name}: a PDF page index must be an int (0-based), got {index!r}")
        pages = [(f"{name} page {index}", render_pdf(path, dpi, pages=[int(index)], name=name)[0])]
    elif _is_pdf(item):
        pages = [(f"{name} page {j}", page) for j, page in enumerate(render_pdf(item, dpi, name=name))]
    else:
        return [(name, load_page(item, name))]  # load_page checks the size
    for page_name, page in pages:
        check_page_size(page, page_name)
    return pages


def check_page_size(image: Image.Image, name: str) -> None:
    if min(image.size) < MIN_PAGE_SIDE:
        raise ValueError(f"{name}: the page is {image.size[0]}×{image.size[1]} pixels; both sides must be at "
                         f"least {MIN_PAGE_SIDE}")


def load_page(item, name: str = "image") -> Image.Image:
    """One image input (see module docstring; not a PDF) -> an RGB PIL image; clear errors otherwise."""
    if isinstance(item, (str, os.PathLike)):
        path = str(item)
        if _is_pdf(path):
            raise ValueError(f"{name}: {path!r} is a PDF; pass it to the pipeline (all pages, or (path, index) "
                             "for one) or render it with mmspec.docs_parse.render_pdf")
        if not os.path.exists(path):
            raise FileNotFoundError(f"{name}: no such image file {path!r}")
        try:
            with Image.open(path) as opened:
                image = opened.convert("RGB")
        except OSError as err:
            raise ValueError(f"{name}: {path!r} is not an image PIL can read ({err})") from None
    elif isinstance(item, Image.Image):
        image = item.convert("RGB")
    elif isinstance(item, (np.ndarray, torch.Tensor)):
        image = _array_to_image(item, name)
    else:
        raise TypeError(f"{name}: expected a file path, a PIL image, a numpy array or a torch tensor, "
                        f"got {type(item).__name__}")
    check_page_size(image, name)
    return image


def _array_to_image(item, name: str) -> Image.Image:
    if 0 in tuple(item.shape):
        raise ValueError(f"{name}: the page array is empty (shape {tuple(item.shape)})")
    if isinstance(item, torch.Tensor):
        array = item.detach().cpu()
        if array.dim() == 3:  # C×H×W, torchvision's layout
            array = array.permute(1, 2, 0)
        array = array.numpy()
    else:
        array = np.asarray(item)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if not (array.ndim == 2 or (array.ndim == 3 and array.shape[2] in (3, 4))):
        raise ValueError(f"{name}: an array page must be H×W (grey) or H×W×3 / H×W×4 (numpy) or C×H×W (torch), "
                         f"got shape {tuple(item.shape)}")
    if array.dtype == np.uint8:
        pixels = array
    elif np.issubdtype(array.dtype, np.floating):
        if not np.isfinite(array).all() or array.min() < 0 or array.max() > 1:
            raise ValueError(f"{name}: a float page must hold finite values in [0, 1], got range "
                             f"[{np.nanmin(array):g}, {np.nanmax(array):g}]")
        pixels = np.round(array * 255).astype(np.uint8)
    else:
        raise TypeError(f"{name}: page pixels must be uint8 or float in [0, 1], got {array.dtype}")
    return Image.fromarray(np.ascontiguousarray(pixels)).convert("RGB")


def render_pdf(path: str | os.PathLike, dpi: int = 150, pages: list[int] | None = None,
               name: str = "pdf") -> list[Image.Image]:
    """Pages of a PDF (all, or the 0-based `pages`) as RGB PIL images, rendered by PDFium (pypdfium2)."""
    import pypdfium2

    _check_dpi(dpi)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name}: no such PDF file {str(path)!r}")
    try:
        document = pypdfium2.PdfDocument(str(path))
    except pypdfium2.PdfiumError as err:
        raise ValueError(f"{name}: {str(path)!r} is not a PDF PDFium can read ({err})") from None
    try:
        count = len(document)
        if count == 0:
            raise ValueError(f"{name}: {str(path)!r} has no pages")
        indices = range(count) if pages is None else pages
        for index in indices:
            if not 0 <= index < count:
                raise ValueError(f"{name}: page index {index} is out of range; {str(path)!r} has {count} pages "
                                 f"(indices 0–{count - 1})")
        return [document[i].render(scale=dpi / 72).to_pil().convert("RGB") for i in indices]
    finally:
        document.close()


def _check_dpi(dpi) -> None:
    if isinstance(dpi, bool) or not isinstance(dpi, int) or not 36 <= dpi <= 1200:
        raise ValueError(f"pdf_dpi must be an int in [36, 1200], got {dpi!r}")


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_regions(regions, sizes: list[tuple[int, int]]) -> list[list[tuple[int, int, int, int]]]:
    """`regions` (one list of (x0, y0, x1, y1) boxes per page) checked against the page sizes."""
    if not isinstance(regions, (list, tuple)) or len(regions) != len(sizes):
        raise ValueError(f"regions must be a list with one list of boxes per page ({len(sizes)} pages), got "
                         f"{type(regions).__name__}{'' if not isinstance(regions, (list, tuple)) else f' of {len(regions)}'}")
    checked = []
    for p, (boxes, (width, height)) in enumerate(zip(regions, sizes)):
        if not isinstance(boxes, (list, tuple)):
            raise ValueError(f"regions[{p}] must be a list of (x0, y0, x1, y1) boxes, got {type(boxes).__name__}")
        page = []
        for r, box in enumerate(boxes):
            if not isinstance(box, (list, tuple)) or len(box) != 4 or not all(
                    isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in box):
                raise ValueError(f"regions[{p}][{r}] must be 4 numbers (x0, y0, x1, y1), got {box!r}")
            x0, y0, x1, y1 = box
            if not (0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
                raise ValueError(f"regions[{p}][{r}] = {tuple(box)} is not a box inside the {width}×{height} "
                                 "page (need 0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height)")
            page.append((x0, y0, x1, y1))
        checked.append(page)
    return checked


def _scale_box(box, from_size: tuple[int, int], to_size: tuple[int, int]) -> tuple[int, int, int, int]:
    sx, sy = to_size[0] / from_size[0], to_size[1] / from_size[1]
    x0, y0, x1, y1 = box
    return (round(x0 * sx), round(y0 * sy), round(x1 * sx), round(y1 * sy))


def page_of_blocks(blocks: list[ParsedBlock]) -> str:
    return "\n\n".join(b.markdown for b in blocks if b.type not in FURNITURE and b.markdown)


# --- the pipeline ------------------------------------------------------------------------------------------

class RegionBranches:
    """The `arrivals=` of a streamed layout+regions decode (after HPD-Parsing): requests 0..P-1 are the pages'
    layout rows; each block a layout row completes (a type token and four box tokens) joins the running decode
    as a region row of its page. Blocks are read as `PagePrompts.decode_layout` reads the finished sequence,
    so the rows are the same as after the whole layout pass.

    Blocks are released in groups of at least `BLOCKS_PER_PAGE_PER_RELEASE` × pages (and whatever is left when
    the last layout row ends): each release costs the decode one prefill forward (the boxes; the page's
    prompt prefix is shared), so releasing every block at once would add about one forward per decode step
    under `ptp`, whose layout rows write about a block a step. On doc-tiny, 3 per page gave the fewest
    forwards over AR and ptp at batch 1 and 4 (1: 31 forwards a page for ptp, 2: 25, 4: 23; AR 85, 79, 84)."""

    BLOCKS_PER_PAGE_PER_RELEASE = 3

    def __init__(self, prompts, num_pages: int, seeds: list[int] | None, generator):
        self.prompts, self.num_pages = prompts, num_pages
        self.release_size = self.BLOCKS_PER_PAGE_PER_RELEASE * num_pages
        self.seeds, self.generator = seeds, generator
        self.target: PageVLMAR | None = None  # set by `DocParsePipeline.decode`
        self.cursor = [0] * num_pages  # where each layout row's next block starts
        self.blocks: list[list[tuple]] = [[] for _ in range(num_pages)]  # (type, box) per page, in order
        self.rows: list[tuple[int, int]] = []  # (page, block index) per region request, in arrival order
        self.pending: list[tuple[int, int]] = []  # blocks found but not yet released as rows
        self.layout_end: float | None = None  # when the last layout row had finished

    def __call__(self, step: int, info: dict) -> ArrivingRows | None:
        if self.layout_end is not None:
            return None
        live = [row for row in info["rows"].tolist() if row < self.num_pages]
        if not live:
            self.layout_end = time.perf_counter()
            return None
        running = False  # whether a layout row goes on after this step (no end token, no length limit yet)
        for page, length in zip(live, info["lengths"][live].tolist()):
            ids = info["sequences"][page, :length].tolist()
            found, self.cursor[page] = self.prompts.layout_blocks(ids, self.cursor[page])
            for block in found:
                self.pending.append((page, len(self.blocks[page])))
                self.blocks[page].append(block)
            running |= length < info["sequences"].shape[1] and ids[-1] != self.prompts.eos_token_id
        if not self.pending or (len(self.pending) < self.release_size and running):
            return None
        release, self.pending = self.pending, []
        self.rows += release
        pages = [page for page, _ in release]
        prompts = [self.prompts.prompt("region", self.blocks[page][index][1]) for page, index in release]
        generators = None if self.seeds is None else [
            DocParsePipeline._region_generator(self.generator, self.seeds, page, index) for page, index in release]
        self.target.add_requests(pages)
        return ArrivingRows(torch.tensor(prompts, device=info["sequences"].device), generator=generators)


class DocParsePipeline(Pipeline):
    """Page parsing over a GOT-OCR2-style VLM (`transformers` `GotOcr2ForConditionalGeneration`) with a
    decoding plugin. Two prompt sets: mmspec's page / layout / region prompts (`PagePrompts`, the bundled
    model), or a real GOT-OCR2 checkpoint's own (`GotOcr2Prompts`: pages, and regions boxed by the caller)."""

    modality = "docs"
    pipeline_name = "docs"
    bench_num_samples = 48
    spec = DOC_SPEC
    call_defaults = DOC_SPEC.call_defaults
    bench_settings = DOC_SPEC.bench_defaults  # mode=regions: read only the held-out pages' true blocks of a type

    def __init__(self, model, tokenizer, processor=None, plugin=None, prompts=None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.prompts = prompts or PagePrompts(tokenizer, model.config.image_seq_length)
        if model.config.image_token_index != self.prompts.image_token_id:
            raise ValueError(f"the model's image_token_index ({model.config.image_token_index}) is not the "
                             f"tokenizer's <image> id ({self.prompts.image_token_id})")
        self.processor = processor or PageImageProcessor()
        self.plugin = plugin
        self.device = next(model.parameters()).device
        self._progress = {}

    @property
    def token_structure(self) -> PageRegions:
        return PageRegions()

    @property
    def max_positions(self) -> int:
        return self.model.config.text_config.max_position_embeddings

    # --- persistence ---------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike = BUNDLED_DOC_DIR, device: str = "cpu",
                        dtype: torch.dtype = torch.float32) -> "DocParsePipeline":
        """A folder with the model (`GotOcr2ForConditionalGeneration`), its tokenizer, `page_processor.json`
        and the attached plugin, if any (what `save_pretrained` and examples/train_doc_vlm.py write)."""
        from transformers import AutoTokenizer, GotOcr2ForConditionalGeneration

        directory = Path(directory)
        if (directory / "config.json").exists() and not (directory / PROCESSOR_FILE).exists() and (
                (directory / "preprocessor_config.json").exists() or (directory / "processor_config.json").exists()):
            from transformers import AutoProcessor

            model = GotOcr2ForConditionalGeneration.from_pretrained(directory, dtype=dtype).to(device)
            pipe = cls.from_got_ocr2(model, AutoProcessor.from_pretrained(str(directory)))
            pipe.plugin = load_saved_plugin(directory)
            return pipe
        for part in ("config.json", "tokenizer.json", PROCESSOR_FILE):
            if not (directory / part).exists():
                raise FileNotFoundError(f"{directory} is not a DocParsePipeline folder: {part} is missing (a "
                                        "GOT-OCR2 checkpoint folder has config.json and preprocessor_config.json)")
        model = GotOcr2ForConditionalGeneration.from_pretrained(directory, dtype=dtype).to(device)
        settings = json.loads((directory / PROCESSOR_FILE).read_text())
        processor = PageImageProcessor(settings["size"], settings["mean"], settings["std"])
        return cls(model, AutoTokenizer.from_pretrained(str(directory)), processor,
                   plugin=load_saved_plugin(directory))

    @classmethod
    def from_got_ocr2(cls, model, processor, format: bool = True, plugin=None) -> "DocParsePipeline":
        """A pipeline over a real GOT-OCR2 checkpoint and its `GotOcr2Processor` (its own prompts and image
        processing): mode "page" reads the page ("OCR with format" when `format`), mode "regions" with
        `regions=` boxes reads each box; there is no layout mode."""
        pixels = GotOcr2PixelProcessor(processor.image_processor)
        prompts = GotOcr2Prompts(processor, model.config.image_seq_length, pixels.size, format=format)
        pipe = cls(model, processor.tokenizer, pixels, plugin=plugin, prompts=prompts)
        pipe.hf_processor = processor
        return pipe

    hf_processor = None  # a GOT-OCR2 checkpoint's processor (from_got_ocr2)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        if self.hf_processor is not None:
            self.hf_processor.save_pretrained(str(directory))
        else:
            self.tokenizer.save_pretrained(str(directory))
            (directory / PROCESSOR_FILE).write_text(json.dumps(self.processor.to_dict(), indent=2))
        self.save_plugin(directory)

    def set_progress_bar_config(self, **kwargs) -> None:
        self._progress = dict(kwargs)

    # --- generation ------------------------------------------------------------------------------
    @torch.no_grad()
    def __call__(self, images, *, mode: str = "page", regions=None, batch_size: int = 4, max_new_tokens: int = 640,
                 temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None, generator=None,
                 pdf_dpi: int = 150, stream: bool | None = None, return_dict: bool = True) -> DocParseOutput:
        """Parse `images` (one page or a list; see the module docstring). stream (layout+regions): start each
        block's region row while the layout pass runs; None does when the plugin can, True insists."""
        items = images if isinstance(images, list) else [images]
        if not items:
            raise ValueError("images is an empty list")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if (regions is not None) != (mode == "regions"):
            raise ValueError("regions= boxes go with mode='regions' (and mode='regions' needs them; "
                             f"mode='layout+regions' finds the boxes itself), got mode={mode!r} and "
                             f"regions={'None' if regions is None else 'boxes'}")
        if "layout" not in self.prompts.tasks and mode in ("layout", "layout+regions"):
            raise ValueError(f"mode={mode!r} needs a layout pass, which this model has no prompt for; use "
                             "mode='page', or mode='regions' with regions= boxes")
        _check_int("batch_size", batch_size, 1)
        _check_int("max_new_tokens", max_new_tokens, 1)
        if stream not in (None, True, False):
            raise ValueError(f"stream must be None, True or False, got {stream!r}")
        if stream is not None and mode != "layout+regions":
            raise ValueError(f"stream= goes with mode='layout+regions' (region rows starting during the layout "
                             f"pass), got mode={mode!r}")
        logits = LogitsPipeline(temperature=temperature, top_k=top_k, top_p=top_p)
        if mode == "layout+regions":
            stream = self._can_stream(stream, logits)
        longest_prompt = len(self.prompts.prompt("region", (0, 0, self.processor.size, self.processor.size)))
        if longest_prompt + max_new_tokens > self.max_positions:
            raise ValueError(f"max_new_tokens must be at most {self.max_positions - longest_prompt} for this model "
                             f"(its {self.max_positions} positions minus a {longest_prompt}-token prompt), "
                             f"got {max_new_tokens}")
        sourced = expand_inputs(items, pdf_dpi)
        pages = [page for _, page in sourced]
        generators = generator if isinstance(generator, list) else [generator] * len(pages)
        if len(generators) != len(pages):
            raise ValueError(f"got {len(generators)} generators for {len(pages)} pages (one per page; a PDF "
                             "gives one page per PDF page)")
        check_generators(None if all(g is None for g in generators) else generators, len(pages))
        boxes = check_regions(regions, [p.size for p in pages]) if regions is not None else None

        out = DocParseOutput([], [], [], [], DecodeStats(), sources=[name for name, _ in sourced])
        starts = range(0, len(pages), batch_size)
        with BatchProgress("parsing", len(starts), len(pages), "page", config=self._progress,
                           disable=len(starts) < 2, per_batch=True) as progress:
            for start in starts:
                chunk = slice(start, start + batch_size)
                chunk_generator = generators[chunk] if isinstance(generator, list) else generator
                self._parse_batch(pages[chunk], mode, None if boxes is None else boxes[chunk], logits,
                                  max_new_tokens, chunk_generator, out, stream)
                progress.update(len(pages[chunk]))
        if not all(out.finished):
            unfinished = [i for i, f in enumerate(out.finished) if not f]
            warnings.warn(f"pages {unfinished} hit max_new_tokens={max_new_tokens} before the end token; their "
                          "markdown is cut (raise max_new_tokens)", stacklevel=2)
        return out if return_dict else (out.markdown,)

    def _parse_batch(self, pages, mode, boxes, logits, max_new_tokens, generator, out: DocParseOutput,
                     stream: bool | None) -> None:
        begin = time.perf_counter()
        stats = DecodeStats()
        features = encode_pages(self.model, self.processor(pages).to(self.device))
        stats.time_encode_s += time.perf_counter() - begin
        stats.add(PAGES, len(pages))
        size = (self.processor.size, self.processor.size)
        num = len(pages)
        if mode in ("page", "layout"):  # one prompt per page
            task = "page" if mode == "page" else "layout"
            rows, st = self.decode(features, list(range(num)), [self.prompts.prompt(task)] * num,
                                   PageRegions(task), logits, max_new_tokens, generator)
            stats = stats.merge(st)
            for page, ids in zip(pages, rows):
                if mode == "page":
                    out.markdown.append(self.prompts.decode_text(ids))
                    out.blocks.append([])
                else:
                    blocks = [ParsedBlock(t, _scale_box(b, size, page.size), None)
                              for t, b in self.prompts.decode_layout(self._strip(ids))]
                    out.markdown.append("")
                    out.blocks.append(blocks)
                out.sequences.append(ids)
                out.finished.append(self._finished(ids))
        else:
            if boxes is None:
                seeds = self._region_seeds(generator)  # drawn before the layout pass, streamed or not
                if stream:
                    layout, parsed, texts, st = self._layout_and_regions_streamed(features, logits, max_new_tokens,
                                                                                  generator, seeds)
                else:
                    layout, parsed, texts, st = self._layout_then_regions(features, logits, max_new_tokens,
                                                                          generator, seeds)
                stats = stats.merge(st)
                page_boxes = [[b for _, b in p] for p in parsed]  # in model pixels
                types = [[t for t, _ in p] for p in parsed]
            else:
                layout = [[] for _ in pages]
                page_boxes = [[_scale_box(b, page.size, size) for b in page_regions]
                              for page, page_regions in zip(pages, boxes)]
                types = [[None] * len(b) for b in page_boxes]
                texts, st = self._regions(features, page_boxes, logits, max_new_tokens,
                                          self._region_generators(generator, self._region_seeds(generator),
                                                                  page_boxes))
                stats = stats.merge(st)
            for p, page in enumerate(pages):
                region_ids = texts[p]
                shown = boxes[p] if boxes is not None else [_scale_box(b, size, page.size) for b in page_boxes[p]]
                blocks = [ParsedBlock(t, tuple(b), self.prompts.decode_text(ids))
                          for t, b, ids in zip(types[p], shown, region_ids)]
                out.blocks.append(blocks)
                out.markdown.append(page_of_blocks(blocks))
                out.sequences.append(layout[p] + [t for ids in region_ids for t in ids])
                out.finished.append(all(self._finished(ids) for ids in [layout[p]] * (boxes is None) + region_ids))
        stats.add(UNFINISHED_ROWS, out.finished[-num:].count(False))
        stats.num_rows = num  # one sample = one page: nfe_per_sample counts a page's decode steps over its passes
        if mode not in ("page", "layout"):  # the decode rows were region prompts after a layout pass, not pages
            stats.forget_rows()
        stats.time_total_s = time.perf_counter() - begin
        out.stats = out.stats.merge(stats)

    def _layout_then_regions(self, features, logits, max_new_tokens, generator, seeds):
        """The layout pass to its end, then every block's region row: (layout ids per page, (type, box) per
        block per page, region ids per block per page, stats)."""
        num = features.shape[0]
        begin = time.perf_counter()
        layout, stats = self.decode(features, list(range(num)), [self.prompts.prompt("layout")] * num,
                                    PageRegions("layout"), logits, max_new_tokens, generator)
        stats.add(TIME_LAYOUT, time.perf_counter() - begin)
        parsed = [self.prompts.decode_layout(self._strip(ids)) for ids in layout]
        page_boxes = [[b for _, b in p] for p in parsed]
        texts, st = self._regions(features, page_boxes, logits, max_new_tokens,
                                  self._region_generators(generator, seeds, page_boxes))
        return layout, parsed, texts, stats.merge(st)

    def _regions(self, features, page_boxes, logits, max_new_tokens, generators):
        """One region row per box (model pixels), all pages in one batch: region ids per box per page, stats."""
        row_pages = [p for p, bs in enumerate(page_boxes) for _ in bs]
        prompts = [self.prompts.prompt("region", b) for bs in page_boxes for b in bs]
        if not prompts:
            return [[] for _ in page_boxes], DecodeStats()
        begin = time.perf_counter()
        texts, stats = self.decode(features, row_pages, prompts, PageRegions("region", len(prompts)), logits,
                                   max_new_tokens, generators, shared_prefix=self._region_prefix_length())
        stats.add(TIME_REGIONS, time.perf_counter() - begin)
        stats.add(REGIONS, len(prompts))
        per_page, cursor = [], 0
        for boxes in page_boxes:
            per_page.append(texts[cursor:cursor + len(boxes)])
            cursor += len(boxes)
        return per_page, stats

    def _layout_and_regions_streamed(self, features, logits, max_new_tokens, generator, seeds):
        """HPD-style: the layout rows run, and each block a layout row completes joins the same running decode
        as a region row at once (`RegionBranches`); returns what `_layout_then_regions` does."""
        num = features.shape[0]
        branches = RegionBranches(self.prompts, num, seeds, generator)
        begin = time.perf_counter()
        rows, stats = self.decode(features, list(range(num)), [self.prompts.prompt("layout")] * num,
                                  PageRegions("layout+regions"), logits, max_new_tokens, generator,
                                  shared_prefix=self._region_prefix_length(), arrivals=branches)
        end = time.perf_counter()
        layout_end = branches.layout_end or end
        stats.add(TIME_LAYOUT, layout_end - begin)
        stats.add(TIME_REGIONS, end - layout_end)
        stats.add(REGIONS, len(branches.rows))
        stats.add(STREAMED, 1)
        texts = [[] for _ in range(num)]
        for (page, _), ids in zip(branches.rows, rows[num:]):
            texts[page].append(ids)
        return rows[:num], branches.blocks, texts, stats

    def _region_prefix_length(self) -> int:
        """How many leading tokens every region prompt has alike (their KV is shared per page)."""
        top = self.processor.size
        a, b = self.prompts.prompt("region", (0, 0, 1, 1)), self.prompts.prompt("region", (top - 1, top - 1, top, top))
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def _can_stream(self, stream: bool | None, logits) -> bool:
        """Whether layout+regions streams: the plugin's decoder must admit rows into a running decode."""
        if stream is False:
            return False
        features = torch.zeros(1, 1, 1, device=self.device)
        target = PageVLMAR(self.model, features, torch.zeros(1, dtype=torch.long), self.prompts.image_token_id)
        request = DecodeRequest(target, logits, PageRegions("layout+regions"),
                                eos_token_id=self.prompts.eos_token_id, pad_token_id=0,
                                conditioning={"image_features": features, "row_pages": target.row_pages})
        blocker = refill_blocker(self.build_decoder(request))
        if blocker is not None and stream:
            raise ValueError(f"stream=True needs a plugin that admits rows into a running decode, but {blocker}; "
                             "use stream=False or leave it None")
        return blocker is None

    def _strip(self, ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] == self.prompts.eos_token_id else ids

    def _finished(self, ids: list[int]) -> bool:
        return bool(ids) and ids[-1] == self.prompts.eos_token_id

    @staticmethod
    def _region_seeds(generator) -> list[int] | None:
        """With one generator per page, one seed per page for its region rows (the page generator's first draw,
        so a page's regions do not depend on the other pages of the batch, nor on streaming); else None."""
        if not isinstance(generator, list) or all(g is None for g in generator):
            return None
        return [int(torch.randint(0, 2 ** 62, (1,), generator=g)) for g in generator]

    @staticmethod
    def _region_generator(generator, seeds, page: int, index: int):
        return torch.Generator(device=generator[page].device).manual_seed(seeds[page] + index)

    @classmethod
    def _region_generators(cls, generator, seeds, page_boxes):
        """One generator per region row when pages have their own (see `_region_seeds`); else the shared one."""
        if seeds is None:
            return generator if not isinstance(generator, list) else None
        return [cls._region_generator(generator, seeds, p, r) for p, bs in enumerate(page_boxes)
                for r in range(len(bs))]

    def decode(self, features, row_pages: list[int], prompts: list[list[int]], structure: PageRegions,
               logits: LogitsPipeline, max_new_tokens: int, generator, shared_prefix: int = 0,
               arrivals: "RegionBranches | None" = None):
        """The attached plugin's decoder over prompt rows reading `features[row_pages[b]]` (the pipeline's
        decode hook). Prompts of different lengths (a GOT-OCR2 checkpoint's box prompts) are left-padded.
        The request's `conditioning` is {"image_features", "row_pages"}. shared_prefix: see `PageVLMAR`;
        arrivals: rows that join while it runs (`RegionBranches`), after the given ones in the output."""
        eos = self.prompts.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        row_pages = torch.tensor(row_pages, device=self.device)
        target = PageVLMAR(self.model, features, row_pages, self.prompts.image_token_id, shared_prefix=shared_prefix)
        if arrivals is not None:
            arrivals.target = target
        request = DecodeRequest(target, logits, structure, eos_token_id=eos, pad_token_id=pad,
                                conditioning={"image_features": features, "row_pages": row_pages})
        longest = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        out = self.run_decoder(request, input_ids, mask, max_new_tokens=max_new_tokens, generator=generator,
                               arrivals=arrivals)
        return out.tolist(), out.stats

    # --- command line ----------------------------------------------------------------------------
    # --- batch protocol (see mmspec.common.batch) ------------------------
    batch_fields = {"page": "path of a page image, or of a PDF (then with 'page_index')",
                    "page_index": "0-based page of the PDF in 'page'"}
    batch_suffix = ".md"

    def batch_input(self, record: dict, base_dir):
        from mmspec.common.batch import path_field

        path = path_field(record, "page", base_dir, self.batch_fields["page"])
        index = record.get("page_index")
        if not _is_pdf(path):
            if index is not None:
                raise ValueError(f"field 'page_index' goes with a PDF in 'page', got it with {path!r}")
            try:
                with Image.open(path) as image:
                    image.verify()
            except Exception:
                raise ValueError(f"field 'page': {path!r} is not an image PIL can read") from None
            return path
        import pypdfium2

        try:
            count = len(pypdfium2.PdfDocument(path))
        except pypdfium2.PdfiumError:
            raise ValueError(f"field 'page': {path!r} is not a PDF PDFium can read") from None
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise ValueError(f"field 'page_index' must be an int in [0, {count}) for {path!r} (one page per "
                             f"line), got {index!r}")
        return (path, index)

    def batch_generate(self, inputs: list, generators: list, call: dict, on_sample_done) -> DecodeStats:
        out = self(list(inputs), generator=generators, batch_size=len(inputs), **call)
        return hand_on_all(out.markdown, out.stats, on_sample_done)

    def batch_write(self, output, path) -> None:
        Path(path).write_text(output + "\n")

    def cli_inputs(self, args):
        from .pages import load_held_out_set

        if args.page:
            return [{"image": path} for path in args.page], False
        return self.cli_held_out(load_held_out_set(), args.num, "pages", "--page"), True

    def cli_generate(self, args, call: dict) -> int:
        """`mmspec generate PLUGIN --page p.png ...`: print each page's markdown. `--out page.md` writes it
        there (all pages, separated by a rule); `--out DIR` writes DIR/<image name>.md per page."""
        paths = [row["image"] for row in self.cli_inputs(args)[0]]
        out = self(paths, batch_size=args.batch_size, **call)
        files = []  # (printed name, file stem) per page: a PDF's pages get _p<index>
        for source in out.sources:
            index, _, pdf_page = re.fullmatch(r"images\[(\d+)\]( page (\d+))?", source).groups()
            path = paths[int(index)]
            files.append((path if pdf_page is None else f"{path} page {pdf_page}",
                          Path(path).stem + ("" if pdf_page is None else f"_p{pdf_page}")))
        for (name, _), markdown in zip(files, out.markdown):
            print(f"=== {name}\n{markdown}\n")
        print(f"{out.stats}  {out.pages_per_second:.2f} pages/s")
        if args.out and str(args.out).lower().endswith(".md"):
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text("\n\n---\n\n".join(out.markdown) + "\n")
        elif args.out:
            os.makedirs(args.out, exist_ok=True)
            for (_, stem), markdown in zip(files, out.markdown):
                Path(args.out, stem + ".md").write_text(markdown + "\n")
        return 0

    # --- bench protocol (see mmspec.common.bench) --------------------------------------------------
    def bench_inputs(self, num_samples: int, seed: int) -> list[dict]:
        from .pages import load_held_out_set

        rows = load_held_out_set()
        if num_samples > len(rows):
            raise ValueError(f"num_samples must be at most {len(rows)} (the held-out pages), got {num_samples}")
        return rows[:num_samples]

    def bench_generate(self, inputs: list[dict], batch_size: int, seed: int, settings: dict):
        """`mode=regions` reads each page's true blocks (`block_type=table` etc.: only blocks of that type), so
        a block type's decoding is measured on its own."""
        gens = [torch.Generator().manual_seed(seed + i) for i in range(len(inputs))]
        settings = dict(settings)
        block_type = settings.pop("block_type", None)
        if block_type is not None and (settings.get("mode") != "regions" or block_type not in BLOCK_TYPES):
            raise ValueError(f"block_type must be one of {BLOCK_TYPES} and goes with mode=regions, got "
                             f"block_type={block_type!r} with mode={settings.get('mode', 'page')!r}")
        if settings.get("mode") == "regions":
            settings["regions"] = [[b.box for b in self._bench_blocks(row, block_type)] for row in inputs]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # cut pages are counted (unfinished_rows) and score as they are
            out = self([row["image"] for row in inputs], batch_size=batch_size, generator=gens, **settings)
        self._bench_block_type = block_type if settings.get("mode") == "regions" else _NOT_REGIONS
        return out.sequences, out.stats

    @staticmethod
    def _bench_blocks(row: dict, block_type: str | None) -> list:
        return [b for b in row["blocks"] if b.type not in FURNITURE and block_type in (None, b.type)]

    def _answers(self, ids: list[int]) -> list[list[int]]:
        """A `DocParseOutput.sequences` entry split into its answers, each up to and including its end token
        (the last may be cut short)."""
        eos = self.prompts.eos_token_id
        segments, current = [], []
        for t in ids:
            current.append(t)
            if t == eos:
                segments.append(current)
                current = []
        if current:
            segments.append(current)
        return segments

    def markdown_of_sequence(self, ids: list[int]) -> tuple[str, list[tuple[str, tuple]]]:
        """A page's markdown and layout from its `DocParseOutput.sequences` entry (any mode)."""
        segments = self._answers(ids)
        type_ids = set(getattr(self.prompts, "type_ids", {}).values())  # a GOT-OCR2 checkpoint has no layout
        if not segments or segments[0][0] not in type_ids:  # page mode: text only
            return self.prompts.decode_text(ids), []
        layout = self.prompts.decode_layout(self._strip(segments[0]))
        regions = segments[1:]
        blocks = [ParsedBlock(t, b, self.prompts.decode_text(r)) for (t, b), r in zip(layout, regions)]
        return (page_of_blocks(blocks) if regions else ""), layout

    def bench_quality(self, inputs: list[dict], sequences: list[list[int]]) -> dict:
        from .metrics import layout_scores, page_scores

        block_type = getattr(self, "_bench_block_type", _NOT_REGIONS)
        if block_type is not _NOT_REGIONS:  # regions mode: each page's chosen true blocks, scored as a page
            predicted = ["\n\n".join(self.prompts.decode_text(a) for a in self._answers(ids)) for ids in sequences]
            references = ["\n\n".join(b.content for b in self._bench_blocks(row, block_type)) for row in inputs]
            return page_scores(predicted, references)
        parsed = [self.markdown_of_sequence(s) for s in sequences]
        quality = {}
        if any(markdown for markdown, _ in parsed):
            quality.update(page_scores([m for m, _ in parsed], [row["markdown"] for row in inputs]))
        if any(layout for _, layout in parsed):
            quality.update(layout_scores([layout for _, layout in parsed],
                                         [[(b.type, b.box) for b in row["blocks"]] for row in inputs]))
        return quality

    def bench_summary(self, inputs: list[dict], stats: DecodeStats, seconds: float) -> dict:
        extra = stats.extra
        return {"pages_per_second": len(inputs) / max(seconds, 1e-9),
                "tokens_per_second": stats.tokens / max(seconds, 1e-9),
                "regions_per_page": extra.get(REGIONS, 0) / len(inputs),
                "unfinished_rows": extra.get(UNFINISHED_ROWS, 0),
                "time_split_by_stage_s": {"encode": stats.time_encode_s, "layout": extra.get(TIME_LAYOUT, 0.0),
                                          "regions": extra.get(TIME_REGIONS, 0.0)}}

    @classmethod
    def bench_sections(cls, results: list[dict]) -> list[tuple[str, str, str]]:
        from .bench import docs_table

        table = docs_table(results)
        if not table:
            return []
        return [("Documents: page parsing quality and throughput",
                 "Held-out rendered pages (docs_parse/bundled/pages_test). Text NED = normalized edit distance of "
                 "text blocks (lower is better); TEDS = tree edit distance similarity of tables (higher is "
                 "better); formula exact = share of formulas reproduced exactly; layout F1 = typed boxes matched "
                 "at IoU ≥ 0.5. Calls / token = decoder forwards per generated token per row.", table)]


def bundled_pipeline(device: str = "cpu") -> DocParsePipeline:
    if not (BUNDLED_DOC_DIR / "config.json").exists():
        raise FileNotFoundError(f"the bundled page VLM is missing from {BUNDLED_DOC_DIR} "
                                "(python examples/train_doc_vlm.py trains it)")
    return DocParsePipeline.from_pretrained(BUNDLED_DOC_DIR, device=device)


__all__ = ["BLOCK_TYPES", "DocParseOutput", "DocParsePipeline", "MODES", "ParsedBlock", "bundled_pipeline",
           "load_page", "render_pdf"]
