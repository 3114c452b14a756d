"""The document pipeline's command-line face (`mmspec.common.pipeline_spec`), with no torch."""

from __future__ import annotations

import json
from dataclasses import dataclass

from mmspec.common.config import count_field, field_choices, temperature_field, top_k_field, top_p_field
from mmspec.common.pipeline_spec import InputFlag, PipelineSpec, check_file

from .pages import BLOCK_TYPES, BUNDLED_DIR

# How a page is read: the whole page in one row; its layout only; layout, then each block as a row of one batch;
# or given regions (`regions=`), each a row.
MODES = ("page", "layout", "layout+regions", "regions")


def check_page_file(path) -> None:
    """An existing PDF, or an image PIL can open."""
    from PIL import Image, UnidentifiedImageError

    check_file(path)
    with open(path, "rb") as handle:
        if handle.read(5) == b"%PDF-":
            return
    try:
        with Image.open(path) as image:
            image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError):
        raise ValueError("neither a PDF nor an image PIL can read (png, jpg, ...)") from None


@dataclass
class DocCallSettings:
    mode: str = field_choices(MODES, default="page", doc="page, layout, layout+regions or regions (see MODES)")
    max_new_tokens: int = count_field(640, doc="the longest output of one row, in tokens")
    temperature: float = temperature_field(0.0)
    top_k: int | None = top_k_field(None)
    top_p: float | None = top_p_field(None)
    stream: bool | None = field_choices((None, True, False), default=None,
                                        doc="layout+regions: start region rows while the layout decodes")


@dataclass
class DocBenchSettings:
    block_type: str | None = field_choices((None, *BLOCK_TYPES), default=None,
                                           doc="mode=regions: read only the held-out pages' true blocks of this type")


def held_out_pages_ceiling(args):
    """`--num` without --page takes the first --num committed held-out pages: at most their number."""
    if getattr(args, "page", None):
        return None
    return len(json.loads((BUNDLED_DIR / "pages_test" / "pages.json").read_text())), "the held-out pages; give --page"


DOC_SPEC = PipelineSpec(
    modality="docs", call_settings=DocCallSettings, bench_settings=DocBenchSettings,
    inputs=(InputFlag("--page", "page image or PDF to parse (repeatable; default: --num held-out pages)",
                      check=check_page_file),),
    out_suffixes=(".md", ""), num_ceiling=held_out_pages_ceiling)
