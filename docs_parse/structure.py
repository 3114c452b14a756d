"""The document pipeline's token structure and its statistics counters.

A page is read in one of three passes — the whole page as markdown, its layout (typed boxes in reading
order), or one block from a region prompt — and each pass is a sequence of tokens from one vocabulary, so
`PageRegions` is a `TokenSequence`: sequence plugins (speculative decoding with a smaller page VLM) run on
every pass, and region-parallel plugins read the pass and the number of regions from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.structure import TokenSequence

PASSES = ("page", "layout", "region", "layout+regions")  # the last: layout rows whose region rows join them

# DecodeStats.extra counters a DocParsePipeline call adds
PAGES = "pages"
REGIONS = "regions"  # region prompts decoded
UNFINISHED_ROWS = "unfinished_rows"  # prompts that hit max_new_tokens before </s>
TIME_LAYOUT = "time_layout_s"  # the layout pass's decode (within the total)
TIME_REGIONS = "time_regions_s"  # the region prompts' decode (streamed: after the layout pass ended)
STREAMED = "streamed_calls"  # layout+regions decodes whose region rows started during the layout pass


@dataclass(frozen=True, eq=False)
class PageRegions(TokenSequence):
    """Tokens of a parsed page: `task` is the pass being decoded ("page", "layout" or "region", or
    "layout+regions" when region rows join the running layout pass);
    `num_regions` the region prompts in this call (None outside the region pass)."""

    task: str = "page"
    num_regions: int | None = None

    def __post_init__(self):
        if self.task not in PASSES:
            raise ValueError(f"PageRegions.task must be one of {PASSES}, got {self.task!r}")
        if self.num_regions is not None and (isinstance(self.num_regions, bool) or not isinstance(self.num_regions, int)
                                             or self.num_regions < 0):
            raise ValueError(f"PageRegions.num_regions must be None or an int >= 0, got {self.num_regions!r}")

    def describe(self) -> str:
        return f"PageRegions({self.task})" if self.num_regions is None else \
            f"PageRegions({self.task}, {self.num_regions} regions)"
