"""Kernels of `ctc_draft`: the CTC side (frame entropy + greedy collapse) and the verification test.

`ctc_greedy` reads CTC logits [B, T, V] once per frame and returns, per row, the collapsed greedy
hypothesis (argmax, repeats merged, blanks dropped) together with the maximum and mean frame entropy
over the row's valid frames only (the public notebooks take the max over padded frames too, so padding
changes a row's gate in a batch; here it cannot).

`floor_accept` is the verification test on one decoder pass: draft token k is kept while it is the
decoder's argmax or its decoder probability reaches `floor` (the paper's likelihood rule; accepting the
argmax as well means the relaxed rule never keeps fewer tokens than the strict one). The token after the
kept prefix is the decoder's argmax there.

The torch references define the semantics; the Triton kernels must reproduce them.
"""

from __future__ import annotations

import torch

from mmspec.common.kernels import HAS_TRITON, assemble_tokens, kernel_backend
from mmspec.common.kernels.triton_utils import require_launchable

if HAS_TRITON:
    import triton
    import triton.language as tl

_MAX_BLOCK_V = 16384


def frame_entropy(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] logits -> [...] entropy (nats) of their softmax, float32."""
    logp = logits.float().log_softmax(-1)
    return -(logp.exp() * logp).sum(-1)


def ctc_greedy_reference(logits, lengths, blank: int):
    """logits [B, T, V]; lengths [B] -> (tokens [B, T] -1 padded, counts [B], max_entropy [B], mean_entropy [B])."""
    batch, frames, _ = logits.shape
    valid = torch.arange(frames, device=logits.device)[None, :] < lengths[:, None]
    best = logits.argmax(-1)
    entropy = frame_entropy(logits)
    previous = torch.cat([torch.full_like(best[:, :1], -1), best[:, :-1]], 1)
    emit = valid & (best != blank) & (best != previous)
    counts = emit.sum(1)
    tokens = torch.full((batch, frames), -1, dtype=torch.long, device=logits.device)
    slot = emit.long().cumsum(1) - 1
    rows = torch.arange(batch, device=logits.device)[:, None].expand_as(slot)
    tokens[rows[emit], slot[emit]] = best[emit]
    max_entropy = torch.where(valid, entropy, torch.zeros_like(entropy)).amax(1)
    mean_entropy = (entropy * valid).sum(1) / lengths.clamp(min=1)
    return tokens, counts, max_entropy, mean_entropy


def emitted_token_surprise(logits: torch.Tensor, lengths: torch.Tensor, blank: int) -> torch.Tensor:
    """[B] −log of the smallest posterior among the frames where greedy CTC emits a token (0 for a row that
    emits none): how unsure the least sure emitted token was. The idea: a wrong hypothesis often has one
    unsure token among confident ones, which the mean frame entropy averages away and the maximum frame
    entropy confuses with unsure blank frames. Measured on asr-tiny it ranks wrong hypotheses no better than
    frame entropy (AUROC 0.78 against the mean entropy's 0.85: README, "Which gate statistic?")."""
    frames = logits.shape[1]
    valid = torch.arange(frames, device=logits.device)[None, :] < lengths.to(logits.device)[:, None]
    logp = logits.float().log_softmax(-1)
    best_logp, best = logp.max(-1)
    previous = torch.cat([torch.full_like(best[:, :1], -1), best[:, :-1]], 1)
    emit = valid & (best != blank) & (best != previous)
    return torch.where(emit, -best_logp, torch.zeros_like(best_logp)).amax(1)


def floor_accept_reference(draft_tokens, target_probs, floor: float, lengths):
    """draft_tokens [B, K]; target_probs [B, K+1, V]; lengths [B] -> (num_accepted [B], tokens [B, K+1] -1 padded)."""
    k = draft_tokens.shape[1]
    argmax = target_probs.argmax(-1)
    p_draft = target_probs[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)
    ok = (p_draft >= floor) | (draft_tokens == argmax[:, :k])
    ok &= torch.arange(k, device=ok.device)[None, :] < lengths[:, None]
    num = ok.long().cumprod(1).sum(1)
    return num, assemble_tokens(draft_tokens, num, argmax.gather(1, num[:, None]).squeeze(1))


if HAS_TRITON:

    @triton.jit(do_not_specialize=["T", "V", "blank"])
    def _ctc_greedy_kernel(logits_ptr, lengths_ptr, tokens_ptr, counts_ptr, max_h_ptr, mean_h_ptr, T, V, blank,
                           BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        v = tl.arange(0, BLOCK_V)
        length = tl.load(lengths_ptr + row)
        previous = -1
        count = 0
        max_h = 0.0
        sum_h = 0.0
        for t in range(0, length):
            x = tl.load(logits_ptr + (row * T + t) * V + v, mask=v < V, other=-1e30).to(tl.float32)
            best = tl.argmax(x, axis=0)
            m = tl.max(x, axis=0)
            e = tl.exp(x - m)
            s = tl.sum(e, axis=0)
            p = e / s
            h = m + tl.log(s) - tl.sum(tl.where(v < V, p * x, 0.0), axis=0)
            max_h = tl.maximum(max_h, h)
            sum_h += h
            emit = (best != blank) & (best != previous)
            tl.store(tokens_ptr + row * T + count, best.to(tl.int64), mask=emit)
            count += emit.to(tl.int32)
            previous = best
        tl.store(counts_ptr + row, count.to(tl.int64))
        tl.store(max_h_ptr + row, max_h)
        tl.store(mean_h_ptr + row, sum_h / tl.maximum(length, 1).to(tl.float32))

    @triton.jit(do_not_specialize=["K", "V"])
    def _floor_accept_kernel(draft_ptr, probs_ptr, argmax_ptr, lengths_ptr, num_ptr, tokens_ptr, K, V, floor,
                             BLOCK_K: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        k = tl.arange(0, BLOCK_K)
        length = tl.load(lengths_ptr + row)
        draft = tl.load(draft_ptr + row * K + k, mask=k < K, other=0)
        best = tl.load(argmax_ptr + row * (K + 1) + k, mask=k < K + 1, other=-1)
        p = tl.load(probs_ptr + (row * (K + 1) + k) * V + draft, mask=k < K, other=0.0)
        ok = ((p >= floor) | (draft == best)) & (k < length)
        num = tl.min(tl.where(ok, BLOCK_K, k), axis=0)  # first position that fails
        num = tl.minimum(num, length)
        tokens = tl.where(k < num, draft, tl.where(k == num, best, -1))
        tl.store(tokens_ptr + row * (K + 1) + k, tokens, mask=k < K + 1)
        tl.store(num_ptr + row, num.to(tl.int64))


def ctc_greedy(logits: torch.Tensor, lengths: torch.Tensor, blank: int = 0):
    """Greedy CTC hypotheses and the entropy gate's statistics; see the module docstring.

    logits [B, T, V] (any float dtype); lengths [B] valid frames per row.
    Returns tokens [B, T] long (-1 padded), counts [B] long, max_entropy [B], mean_entropy [B] float32.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be [batch, frames, vocab], got shape {tuple(logits.shape)}")
    batch, frames, vocab = logits.shape
    if lengths.shape != (batch,) or bool((lengths < 0).any()) or bool((lengths > frames).any()):
        raise ValueError(f"lengths must be [batch] with values in [0, {frames}], got {lengths.tolist()}")
    if not 0 <= blank < vocab:
        raise ValueError(f"blank must be a vocabulary id in [0, {vocab}), got {blank}")
    lengths = lengths.long().to(logits.device)
    if kernel_backend(logits.device) != "triton" or batch == 0 or frames == 0 or vocab > _MAX_BLOCK_V:
        return ctc_greedy_reference(logits, lengths, blank)
    require_launchable(_ctc_greedy_kernel, logits.device)
    tokens = torch.full((batch, frames), -1, dtype=torch.long, device=logits.device)
    counts = torch.empty(batch, dtype=torch.long, device=logits.device)
    max_h = torch.empty(batch, dtype=torch.float32, device=logits.device)
    mean_h = torch.empty(batch, dtype=torch.float32, device=logits.device)
    _ctc_greedy_kernel[(batch,)](logits.contiguous(), lengths.contiguous(), tokens, counts, max_h, mean_h,
                                 frames, vocab, blank, BLOCK_V=triton.next_power_of_2(vocab))
    return tokens, counts, max_h, mean_h


def floor_accept(draft_tokens: torch.Tensor, target_probs: torch.Tensor, floor: float,
                 lengths: torch.Tensor | None = None):
    """The relaxed verification test (see module docstring); floor in [0, 1]. lengths [B]: drafts per row."""
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"floor must be in [0, 1], got {floor!r}")
    batch, k = draft_tokens.shape
    if target_probs.dim() != 3 or target_probs.shape[:2] != (batch, k + 1):
        raise ValueError(f"target_probs must be [{batch}, {k + 1}, V], got {tuple(target_probs.shape)}")
    if lengths is None:
        lengths = torch.full((batch,), k, dtype=torch.long, device=draft_tokens.device)
    lengths = lengths.long().to(draft_tokens.device)
    if bool((lengths < 0).any()) or bool((lengths > k).any()):
        raise ValueError(f"lengths must lie in [0, {k}], got {lengths.tolist()}")
    draft_tokens = draft_tokens.long()
    if kernel_backend(draft_tokens.device) != "triton" or batch == 0:
        return floor_accept_reference(draft_tokens, target_probs, floor, lengths)
    require_launchable(_floor_accept_kernel, draft_tokens.device)
    num = torch.empty(batch, dtype=torch.long, device=draft_tokens.device)
    tokens = torch.empty(batch, k + 1, dtype=torch.long, device=draft_tokens.device)
    _floor_accept_kernel[(batch,)](draft_tokens.contiguous(), target_probs.float().contiguous(),
                                   target_probs.argmax(-1).contiguous(), lengths.contiguous(), num, tokens,
                                   k, target_probs.shape[-1], float(floor), BLOCK_K=triton.next_power_of_2(k + 1))
    return num, tokens
