"""`rvq_spec`: RVQ position-aware speculative decoding of a TTS model's depth decoder.

After the backbone samples code level 0 of a frame, a depth decoder (CSM's, Qwen3-TTS's code predictor)
emits levels 1 … K−1 one call each. `rvq_spec` drafts the next levels from the depth decoder's newest
state with the frozen heads of those levels applied to h + o_d (`drafter.py`; offsets learned by
self-distillation, `training.py`; `offsets="none"` is training-free head-ahead drafting) and verifies
[newest code, drafts] in one depth-decoder call, each position with its own embedding table and head.

Acceptance is the core's (`mmspec.common.accept`): greedy match, and speculative sampling on the *processed*
target distribution (temperature, top-k, top-p applied to both sides), with the residual max(p − q, 0)
at the first rejection and a bonus code when every draft passes — so the codes follow plain AR's law
exactly under the deployed top-k sampling, and greedy codes equal plain AR's. Static trees use the core's
multi-candidate rejection. The acceptance kernel is the core's `speculative_accept` (Triton, with its torch
reference), tested at the depth decoder's shapes in tests/plugins/test_rvq_spec.py; this package adds no
kernel of its own.

Batching: the texts of a batch decode each frame's depth levels as one ragged batch (each row accepts its
own number of codes per call and leaves the batch when its frame is complete); frames stay in lockstep
only because the backbone's next step needs every code of the current frame.

Anchors: "RVQ Position Aware Speculative Decoding for On-Device TTS" (Argmax; 2.47 accepted codes per
call on Qwen3-TTS 0.6B, 2–2.2× RVQ generation speed-up, lossless) and TensorRT-Edge-LLM's CodePredictor
speculative decoding (head-ahead drafting, chains, window 2–8).
"""

from __future__ import annotations

from pathlib import Path

from mmspec.common.accept import GreedyMatch, SpeculativeSampling
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.heads import load_head
from mmspec.common.plugin import Plugin
from mmspec.common.registry import register_plugin
from mmspec.common.structure import RVQFrames
from mmspec.common.tree import parse_branching

from .config import RVQSpecConfig
from .drafter import OffsetDrafter, RVQOffsets

__all__ = ["RVQSpecPlugin", "RVQSpecConfig", "OffsetDrafter", "RVQOffsets", "BUNDLED_OFFSETS"]

BUNDLED_OFFSETS = Path(__file__).resolve().parent / "bundled" / "tts_tiny_offsets"  # trained on tts-tiny
NO_OFFSETS = "none"


@register_plugin("rvq_spec")
class RVQSpecPlugin(Plugin):
    modality = "speech"
    lossless = True
    paper = ("RVQ Position Aware Speculative Decoding for On-Device TTS (Argmax); TensorRT-Edge-LLM "
             "CodePredictor speculative decoding")
    Config = RVQSpecConfig
    requires = RVQFrames
    default_model = "tts-tiny"
    bench_default_variants = ({"batch_size": 1, "num_samples": 40},)
    bench_variants = tuple({"num_samples": 8, "settings": s} for s in (
        {"num_draft_tokens": 2}, {"num_draft_tokens": 3}, {"num_draft_tokens": 6},
        {"offsets": NO_OFFSETS}, {"offsets": NO_OFFSETS, "num_draft_tokens": 6},
        {"tree_branching": "3,1,1,1"}, {"temperature": 0.0, "depth_temperature": 0.0},
        {"tree_branching": "3,1,1,1", "temperature": 0.0, "depth_temperature": 0.0})) + (
        {"batch_size": 4, "num_samples": 8},)

    def __init__(self, **config):
        super().__init__(**config)
        self.tree = parse_branching(self.config.tree_branching, "RVQSpecConfig.tree_branching")
        if not isinstance(self.config.offsets, str):
            raise ValueError(f"RVQSpecConfig.offsets must be '' (bundled), 'none' or a folder, got "
                             f"{self.config.offsets!r}")
        self._offsets: RVQOffsets | None = None

    @property
    def draft_depth(self) -> int:
        return self.tree.max_depth if self.tree is not None else self.config.num_draft_tokens

    def offsets_module(self) -> RVQOffsets | None:
        """The offsets this plugin drafts with (None: head-ahead drafting), loaded once."""
        if self.config.offsets == NO_OFFSETS:
            return None
        if self._offsets is None:
            self._offsets = load_head(RVQOffsets, self.config.offsets or BUNDLED_OFFSETS, "RVQSpecConfig.offsets")
        return self._offsets

    def _offsets_name(self) -> str:
        return f"offsets {self.config.offsets!r}" if self.config.offsets else \
            "the bundled offsets (trained on tts-tiny)"

    def check_structure(self, structure: RVQFrames) -> None:
        """Draft length and offsets must fit the frames' depth and the depth decoder's width."""
        most = structure.depth - 2
        if most < 1:
            raise ValueError(f"plugin 'rvq_spec' needs at least 3 code levels per frame; {structure.describe()} "
                             "leaves nothing to draft")
        if self.draft_depth > most:
            what = "RVQSpecConfig.num_draft_tokens" if self.tree is None else "the depth of RVQSpecConfig.tree_branching"
            raise ValueError(f"{what} must be in 1..{most} for {structure.describe()} (the first depth-decoder "
                             f"call of a frame yields code 1, leaving {most} codes to draft), got {self.draft_depth}")
        offsets = self.offsets_module()
        if offsets is not None:
            offsets.check_fits(structure.depth, structure.state_size, self._offsets_name())

    def check_pipeline(self, pipeline) -> None:
        super().check_pipeline(pipeline)
        self.check_structure(pipeline.token_structure)

    def build_decoder(self, pipeline, request):
        from mmspec.speech.tts_model import RVQDepthModel

        target = request.target
        if not isinstance(target, RVQDepthModel):
            raise TypeError(f"plugin 'rvq_spec' drafts with a depth decoder's per-level heads; the target is a "
                            f"{type(target).__name__}, not an RVQDepthModel")
        self.check_structure(request.structure)
        offsets = self.offsets_module()
        if offsets is not None:
            offsets = offsets.to(target.device)
        drafter = OffsetDrafter(target, offsets, num_draft_tokens=self.config.num_draft_tokens, tree=self.tree)
        rule = GreedyMatch() if request.logits.greedy else SpeculativeSampling()
        return SpeculativeDecoder(target, drafter, rule, request.logits,
                                  num_draft_tokens=self.config.num_draft_tokens if self.tree is None else 0,
                                  eos_token_id=request.eos_token_id, pad_token_id=request.pad_token_id)

    def save_pretrained(self, directory):
        """The offsets this plugin drafts with, under `rvq_offsets/` (none saved for head-ahead drafting)."""
        offsets = self.offsets_module()
        if offsets is None:
            return {}
        offsets.save_pretrained(directory / "rvq_offsets")
        return {"offsets": "rvq_offsets"}
