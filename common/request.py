"""`DecodeRequest`: what a pipeline hands a plugin for one generation (the only thing a plugin sees of it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .logits import LogitsPipeline
from .model import ARModel
from .structure import TokenStructure


@dataclass
class DecodeRequest:
    """What a pipeline hands a plugin for one generation."""

    target: ARModel  # the model that verifies (CFG already folded in when guidance is on)
    logits: LogitsPipeline  # temperature / top-k / top-p, applied alike to drafts and target
    structure: TokenStructure  # the shape of this call's tokens (e.g. this image's code grid)
    eos_token_id: int | None = None
    pad_token_id: int = -1
    draft_model: ARModel | None = None  # a separate draft model over the target's vocabulary, if any
    conditioning: object = None  # the modality's encoder output for this batch (opaque to the core)
    extra: dict = field(default_factory=dict)  # anything else a modality passes its own plugins
