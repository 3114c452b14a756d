"""Qwen3-Omni's talker code predictor (the depth decoder of Qwen3-Omni / Qwen3-TTS) as an `RVQDepthModel`.

`Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration` is the shape Qwen3-TTS ships: after the
talker emits code group 0 of a frame, the code predictor is prefilled with [talker hidden state, talker
embedding of code 0] and generates groups 1 … G−1, one call each. Position p >= 2 is fed code p−1 through
*its own* input table (`model.codec_embedding[p − 2]`) and position p >= 1 is scored by *its own* head
(`lm_head[p − 1]`), chosen in transformers by a `generation_steps` counter — one head per call, so several
drafted codes cannot be verified through its `forward`. This adapter runs the same layers with per-position
tables and heads, so `rvq_spec` verifies a chain or tree of drafts in one call.

Only the code predictor is adapted: the talker (a MoE transformer conditioned on the thinker's hidden
states) is not part of mmspec's `TTSPipeline`, so a Qwen3-Omni user runs the talker loop and calls the
plugin's decoder per frame (see `docs/tts.md`, "rvq_spec on your own model").
"""

from __future__ import annotations

import torch

from ..common.model import DecodeState, ModelOutput
from .tts_model import RVQDepthModel


def tiny_code_predictor_config(num_code_groups: int = 8, vocab_size: int = 64, hidden_size: int = 32,
                               num_layers: int = 1, num_heads: int = 2):
    """A small `Qwen3OmniMoeTalkerCodePredictorConfig` (tests and offline experiments)."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTalkerCodePredictorConfig

    return Qwen3OmniMoeTalkerCodePredictorConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        head_dim=hidden_size // num_heads, num_code_groups=num_code_groups, max_position_embeddings=64)


class Qwen3OmniCodePredictorAR(RVQDepthModel):
    """A Qwen3-Omni code predictor for one frame of a batch.

    talker_hidden [B, H]: the talker's last hidden state (position 0). code0_embedding: the talker's own
    embedding of code group 0 (a module mapping ids [..] -> [.., H]; position 1 is fed through it).
    """

    def __init__(self, code_predictor, talker_hidden: torch.Tensor, code0_embedding):
        self.model = code_predictor
        self.config = code_predictor.config
        self.vocab_size = self.config.vocab_size
        self.codebook_size = self.config.vocab_size
        self.num_codebooks = self.config.num_code_groups
        self.hidden_size = self.config.hidden_size
        self.device = talker_hidden.device
        self.backbone_hidden = talker_hidden
        self.code0_embedding = code0_embedding

    def embed(self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        tables = self.model.model.codec_embedding
        ids = tokens.clamp(0, self.vocab_size - 1)
        out = self.code0_embedding(ids).to(self.mask_dtype())
        for level in range(1, self.num_codebooks - 1):  # code `level` is fed at position level + 1
            at = positions == level + 1
            if bool(at.any()):
                out = torch.where(at[..., None], tables[level - 1](ids), out)
        hidden = state.extra["hidden"].to(out.dtype)[:, None, :].expand_as(out)
        return torch.where((positions == 0)[..., None], hidden, out)

    def code_logits(self, hidden: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
        logits = hidden.new_zeros(hidden.shape[0], self.vocab_size)
        for level in levels.unique().tolist():
            rows = levels == level
            logits[rows] = self.model.lm_head[level - 1](hidden[rows])
        return logits.float()

    def _run(self, state, tokens, positions, mask4d, output_hidden):
        tokens, positions = tokens.to(self.device), positions.to(self.device)
        x = self.run_layers(state, self.embed(state, tokens, positions), positions, mask4d)
        levels = positions.clamp(1, self.num_codebooks - 1)
        logits = self.code_logits(x.reshape(-1, x.shape[-1]), levels.reshape(-1)).view(*x.shape[:2], -1)
        return ModelOutput(logits=logits.masked_fill((positions == 0)[..., None], 0.0),
                           hidden=x if output_hidden else None)
