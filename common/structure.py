"""Token structures: what shape a pipeline's generated tokens have, as a small typed object.

A pipeline *offers* one (`Pipeline.token_structure`); a plugin *declares* the kind it needs
(`Plugin.requires`), and `load_plugin` checks the match before any heavy work. Each decode also gets the
structure of that call (`DecodeRequest.structure`: e.g. the grid of an image whose size is chosen per
call), so a plugin reads the grid shape or the RVQ depth from it instead of probing the pipeline.

Structures are open: a modality may define a subclass carrying what its plugins need (a transcript whose
encoder also gives a CTC hypothesis, say), and a plugin that requires the subclass only runs there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class TokenStructure:
    """Any token structure; a plugin that requires this runs on every pipeline (plain AR does)."""

    def describe(self) -> str:
        return type(self).__name__


@dataclass(frozen=True, eq=False)
class TokenSequence(TokenStructure):
    """A 1-D sequence of tokens from one vocabulary (text, transcripts)."""


@dataclass(frozen=True, eq=False)
class CodeGrid(TokenStructure):
    """A 2-D grid of codes generated in raster order (row-major), e.g. an image's VQ codes.

    latents: [V, D] the codebook's latent vector per code, for methods that compare codes by latent
    (None where the model has no codebook to share).
    rows_in_parallel: whether the model can decode several rows at once (tokens fed out of raster order,
    placeholders fed for their output only); False where the model ties extra tokens to raster order.
    """

    rows: int
    cols: int
    latents: torch.Tensor | None = None  # [V, D] float
    rows_in_parallel: bool = True

    def __post_init__(self):
        for name in ("rows", "cols"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CodeGrid.{name} must be an int >= 1, got {value!r}")

    @property
    def num_tokens(self) -> int:
        return self.rows * self.cols

    def describe(self) -> str:
        return f"CodeGrid({self.rows}x{self.cols})"


@dataclass(frozen=True, eq=False)
class RVQFrames(TokenStructure):
    """Frames of residual-vector-quantizer codes: each frame is `depth` codes, level 0 first
    (codec audio models: a backbone predicts level 0, a depth decoder the levels below)."""

    depth: int
    codebook_size: int
    state_size: int | None = None  # width of the depth decoder's hidden states (what drafting heads read)

    def __post_init__(self):
        for name in ("depth", "codebook_size", "state_size"):
            value = getattr(self, name)
            if name == "state_size" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RVQFrames.{name} must be an int >= 1, got {value!r}")

    def describe(self) -> str:
        return f"RVQFrames(depth {self.depth})"


def structure_names(kinds) -> str:
    """'CodeGrid' or 'CodeGrid or RVQFrames', for error messages."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(k.__name__ for k in kinds)
