"""`zipar`: training-free next-set decoding (He et al., ICML 2025, "ZipAR", arXiv:2412.04062).

Image tokens are laid out in raster order on an H×W grid, but a token depends
mostly on its spatial neighbours. ZipAR starts row r once the row above has
`window` tokens and from then on advances every started row by one token per
forward: one forward feeds each active row's newest token at its own raster
position and samples the next token of every active row. Row 0 stays
sequential, so an image takes (H−1)·window + W forwards instead of H·W.

Differences from the public code, on purpose:
- Attention is explicit: a query sees exactly the tokens generated so far at
  lower raster positions. (LlamaGen's static cache lets not-yet-written zero
  K/V slots of the row above dilute attention.)
- A new row r is seeded by feeding a placeholder at the end of row r−1 (whose
  true last token does not exist yet): a copy of row r−1's newest token, its
  nearest generated neighbour. The placeholder is fed query-only: it attends,
  but nothing ever attends to it and it never enters the cache; the true token
  is fed once it is sampled. (LlamaGen copies the newest token of row r−2 and keeps it
  in the cache until the true one overwrites it.)
- Every row, including row 1, starts after `window` tokens of the row above
  (LlamaGen's code waits for row 0 to finish before row 1).

With window = W every row waits for the row above to finish and the schedule
is exactly plain AR (greedy output identical; the test of the masking). The
method is lossy otherwise: tokens are drawn from distributions that do not see
the right part of the row above. The cost is measured in BENCHMARKS.md.
"""

from __future__ import annotations


from mmspec.common.plugin import Plugin
from mmspec.common.registry import register_plugin
from mmspec.common.schedule import Schedule, ScheduledDecoder, ScheduleStep
from mmspec.common.structure import CodeGrid

from .config import ZipARConfig
from .verified import VerifiedNextSetDecoder

__all__ = ["next_set_schedule", "num_next_set_forwards"]


def num_next_set_forwards(height: int, width: int, window: int) -> int:
    """Forwards per image: row r starts r·window forwards after row 0, and every row takes W forwards."""
    return (height - 1) * window + width


def _check_grid(height, width, window) -> None:
    for name, value in (("height", height), ("width", width), ("window", window)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if window > width:
        raise ValueError(f"window must be between 1 and the grid width ({width}), got {window}")


def next_set_schedule(height: int, width: int, window: int) -> Schedule:
    """The ZipAR schedule over an H×W raster grid (generated index i = row·W + column)."""
    _check_grid(height, width, window)
    done = [0] * height  # tokens generated per row
    unfed: list[int] = []  # sampled tokens whose key/value is not in the cache yet
    schedule = Schedule(num_tokens=height * width)
    while done[-1] < width:
        samplers = [r for r in range(height)
                    if done[r] < width and (r == 0 or done[r - 1] >= min(done[r] + window, width))]
        feed = [-1] if not schedule.steps else list(unfed)
        source, query_only = list(feed), [False] * len(feed)
        sample_from, sample_index = [], []
        for r in samplers:
            index = r * width + done[r]
            previous = index - 1
            if previous in feed:
                slot = feed.index(previous)
            else:  # the end of the row above does not exist yet: seed with a placeholder
                above = r - 1
                feed.append(previous)
                source.append(above * width + done[above] - 1)
                query_only.append(True)
                slot = len(feed) - 1
            sample_from.append(slot)
            sample_index.append(index)
        schedule.steps.append(ScheduleStep(feed, source, query_only, sample_from, sample_index))
        unfed = sample_index
        for r in samplers:
            done[r] += 1
    schedule.check()
    return schedule


@register_plugin("zipar")
class ZipARPlugin(Plugin):
    modality = "vision"
    lossless = False
    lossless_config = {"mode": "verified"}
    paper = "He et al. 2025, ZipAR: next-set decoding (ICML 2025, arXiv:2412.04062)"
    Config = ZipARConfig
    requires = CodeGrid
    bench_default_variants = ({"batch_size": 1}, {"batch_size": 4})
    # Sweeps at batch 4 on 40 images (CPU time); the default rows give batch-1 latency and 100-image quality.
    bench_variants = tuple({"batch_size": 4, "num_samples": 40, "settings": settings} for settings in (
        {"window": 2}, {"window": 4}, {"window": 16},
        {"mode": "verified", "window": 2}, {"mode": "verified", "window": 4}, {"mode": "verified", "window": 8}))

    def __init__(self, **config):
        super().__init__(**config)
        self.lossless = self.config.mode == "verified"

    def check_pipeline(self, pipeline) -> None:
        """Also: rows decoded in parallel, and a window that fits the image's rows (fail at load time)."""
        super().check_pipeline(pipeline)
        grid = pipeline.token_structure
        if not grid.rows_in_parallel:
            raise ValueError(f"plugin 'zipar' decodes several image rows at once; {type(pipeline).__name__}'s "
                             "model ties its tokens to raster order (e.g. Emu3's end-of-line tokens)")
        if self.config.window > grid.cols:
            raise ValueError(f"plugin 'zipar': window must be between 1 and the grid width ({grid.cols}), "
                             f"got {self.config.window}")

    def build_decoder(self, pipeline, request):
        target, logits = request.target, request.logits
        height, width = request.structure.rows, request.structure.cols
        if self.config.mode == "verified":
            _check_grid(height, width, self.config.window)
            return VerifiedNextSetDecoder(target, height, width, self.config.window, logits,
                                          pad_token_id=request.pad_token_id)
        return ScheduledDecoder(target, next_set_schedule(height, width, self.config.window), logits,
                                pad_token_id=request.pad_token_id)
