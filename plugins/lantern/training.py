"""Self-distillation of an EAGLE head on a frozen target, through the target's ARModel adapter.

Works for any adapter that returns hidden states and exposes its embeddings and output layer (the bundled
LlamaGen model, HF Janus / Emu3 / Chameleon): the teacher pass is `adapter.prefill(ids, output_hidden=True)`.
For the head's pair at position i (target feature f_i, token i+1) the losses are, as in EAGLE,
SmoothL1(predicted f_{i+1}, f_{i+1}) + token_weight · cross-entropy of the target's output layer on the
prediction against the target's own distribution at i+1. Inputs get uniform feature noise (EAGLE: ±0.2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmspec.common.model import ARModel

from .drafter import BoundHead


@torch.no_grad()
def teacher_pass(target: ARModel, ids: torch.Tensor, mask: torch.Tensor | None = None):
    """Target features [B, T, H] and distributions [B, T, V] of token sequences [B, T] (left-padded)."""
    _, out = target.prefill(ids, mask, output_hidden=True)
    return out.hidden.float(), out.logits.float().softmax(-1)


def pair_inputs(ids: torch.Tensor, features: torch.Tensor, mask: torch.Tensor | None,
                first_code: int | torch.Tensor):
    """The head's training pairs of sequences [B, T]: (features f_i, tokens i+1, positions i) for
    i = 0..T−3, and which pairs count in the loss (the target predicts a code at i+1, i.e. i+1 >= first_code
    within the row, and both tokens are real). first_code: one int, or one per row [B] (prompts of
    different lengths)."""
    batch, length = ids.shape
    valid = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    positions = (valid.long().cumsum(1) - 1).clamp(min=0)
    pair_tokens, pair_features = ids[:, 1:-1], features[:, :-2]
    pair_pos = positions[:, :-2]
    if isinstance(first_code, torch.Tensor):
        first_code = first_code.to(ids.device)[:, None]
    counts = valid[:, :-2] & valid[:, 1:-1] & (positions[:, 1:-1] >= first_code)
    return pair_tokens, pair_features, pair_pos, counts


def distill_losses(bound: BoundHead, ids: torch.Tensor, features: torch.Tensor, probs: torch.Tensor,
                   mask: torch.Tensor | None = None, *, first_code: int = 1, noise: float = 0.2,
                   generator: torch.Generator | None = None):
    """(feature loss, token loss, predicted logits, target distributions) over the counted pairs."""
    tokens, feats, positions, counted = pair_inputs(ids, features, mask, first_code)
    if noise:
        u = torch.rand(feats.shape, generator=generator, device=feats.device)
        feats = feats + (2 * u - 1) * noise
    # Causal attention over the pairs, padding hidden (left padding keeps real pairs contiguous at the end).
    length = tokens.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
    pad_ok = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.bool()[:, :-2]
    visible = causal[None] & pad_ok[:, None, :]
    visible |= torch.eye(length, dtype=torch.bool, device=ids.device)[None]
    additive = torch.zeros(visible.shape, device=ids.device).masked_fill(~visible, torch.finfo(torch.float32).min)
    predicted = bound.head(feats, bound.embed(tokens), positions, additive[:, None].to(bound.head.fc.weight.dtype))
    target_feats, target_probs = features[:, 1:-1], probs[:, 1:-1]
    feat_loss = F.smooth_l1_loss(predicted.float()[counted], target_feats[counted])
    logits = bound.logits(predicted)[counted]
    token_loss = -(target_probs[counted] * logits.log_softmax(-1)).sum(-1).mean()
    return feat_loss, token_loss, logits, target_probs[counted]


@torch.no_grad()
def expected_acceptance(bound: BoundHead, target: ARModel, ids: torch.Tensor, mask=None, *, first_code: int = 1,
                        batch_size: int = 100) -> float:
    """Mean Σ_x min(p(x), q(x)) of the head's one-step drafts on real features: the chance speculative
    sampling keeps the first draft token."""
    total, n = 0.0, 0
    for i in range(0, len(ids), batch_size):
        part_mask = None if mask is None else mask[i:i + batch_size]
        part_first = first_code[i:i + batch_size] if isinstance(first_code, torch.Tensor) else first_code
        feats, probs = teacher_pass(target, ids[i:i + batch_size], part_mask)
        *_, logits, wanted = distill_losses(bound, ids[i:i + batch_size], feats, probs, part_mask,
                                            first_code=part_first, noise=0.0)
        total += torch.minimum(logits.softmax(-1), wanted).sum(-1).sum().item()
        n += logits.shape[0]
    return total / max(n, 1)
