"""Kernels of the Jacobi family: maximal coupling (MC-SJD) and GSD's group sums.

SJD's own acceptance test with residual resampling is speculative sampling
against the distribution each draft was drawn from, so it runs on the core's
`speculative_accept` kernel unchanged. The two ops here are what the family
adds. Each has a torch reference (the semantics) and a Triton kernel that must
reproduce it token for token; `kernel_backend` picks one per call.
"""

from __future__ import annotations

import torch

from mmspec.common.kernels import HAS_TRITON, kernel_backend, residual_distribution, sample_inverse_cdf
from mmspec.common.kernels.triton_utils import require_launchable

if HAS_TRITON:
    import triton
    import triton.language as tl

    from mmspec.common.kernels.triton_utils import sample_residual

_MAX_BLOCK_V = 1024
_MAX_BLOCK_D = 128


def _check_rows(name: str, t: torch.Tensor, shape: tuple, floating: bool) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if floating != t.dtype.is_floating_point:
        kind = "a floating-point" if floating else "an integer"
        raise ValueError(f"{name} must be {kind} tensor, got dtype {t.dtype}")


# --------------------------------------------------------------------------
# Maximal coupling
# --------------------------------------------------------------------------

def maximal_coupling_reference(prev_tokens, prev_probs, new_probs, keep_uniform, residual_uniform):
    """Keep x ~ q with probability min(1, p(x)/q(x)), else draw from norm(max(p − q, 0)).

    The result is distributed exactly as p and equals x with probability 1 − TV(p, q), the most
    any coupling can achieve. A token p forbids (p(x) = 0) is never kept. When p == q (up to
    rounding) the residual is empty and p itself is sampled; the keep test then always passes.
    """
    x = prev_tokens[:, None]
    p_x = new_probs.gather(1, x).squeeze(1)
    q_x = prev_probs.gather(1, x).squeeze(1)
    keep = (keep_uniform * q_x <= p_x) & (p_x > 0)
    sampled = sample_inverse_cdf(residual_distribution(new_probs, prev_probs), residual_uniform)
    return torch.where(keep, prev_tokens, sampled), keep


if HAS_TRITON:

    @triton.jit(do_not_specialize=["V"])
    def _maximal_coupling_kernel(prev_tokens_ptr, prev_probs_ptr, new_probs_ptr, keep_uniform_ptr,
                                 residual_uniform_ptr, tokens_ptr, kept_ptr, V, BLOCK_V: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        q_row = prev_probs_ptr + row * V.to(tl.int64)
        p_row = new_probs_ptr + row * V.to(tl.int64)
        x = tl.load(prev_tokens_ptr + row)
        p_x = tl.load(p_row + x)
        keep = (tl.load(keep_uniform_ptr + row) * tl.load(q_row + x) <= p_x) & (p_x > 0.0)

        # Drawn for every row and used where the keep test fails: one code path, no divergent branch.
        sampled = sample_residual(p_row, q_row, V, True, 0, tl.load(residual_uniform_ptr + row), True,
                                  BLOCK_V).to(tl.int64)
        tl.store(tokens_ptr + row, tl.where(keep, x, sampled))
        tl.store(kept_ptr + row, keep.to(tl.int8))

    @triton.jit(do_not_specialize=["V", "C", "D"])
    def _group_sums_kernel(tokens_ptr, candidates_ptr, target_ptr, draft_ptr, emb_ptr, pooled_p_ptr,
                           pooled_q_ptr, V, C, D, prob_gap, dist_threshold,
                           BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BLOCK_C)
        x = tl.load(tokens_ptr + row)
        cand = tl.load(candidates_ptr + row * C + c, mask=c < C, other=-1)
        valid = cand >= 0
        safe = tl.where(valid, cand, 0)
        p_row = target_ptr + row * V.to(tl.int64)
        q_row = draft_ptr + row * V.to(tl.int64)
        p_c = tl.load(p_row + safe, mask=valid, other=0.0)
        q_c = tl.load(q_row + safe, mask=valid, other=0.0)
        p_x = tl.load(p_row + x)

        dist = tl.zeros([BLOCK_C], dtype=tl.float32)
        for start in range(0, D, BLOCK_D):
            d = start + tl.arange(0, BLOCK_D)
            e_x = tl.load(emb_ptr + x * D + d, mask=d < D, other=0.0)
            e_c = tl.load(emb_ptr + safe[:, None] * D + d[None, :], mask=valid[:, None] & (d[None, :] < D),
                          other=0.0)
            diff = e_c - e_x[None, :]
            dist += tl.sum(diff * diff, axis=1)
        near = (tl.abs(p_c - p_x) < prob_gap) & (dist < dist_threshold)
        member = valid & (near | (cand == x))
        tl.store(pooled_p_ptr + row, tl.sum(tl.where(member, p_c, 0.0), axis=0))
        tl.store(pooled_q_ptr + row, tl.sum(tl.where(member, q_c, 0.0), axis=0))


def maximal_coupling(prev_tokens: torch.Tensor, prev_probs: torch.Tensor, new_probs: torch.Tensor,
                     keep_uniform: torch.Tensor, residual_uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Couple each previous draft x ~ prev_probs with a fresh draw from new_probs (rows independent).

    prev_tokens [N] long; prev_probs, new_probs [N, V]; keep_uniform, residual_uniform [N] in [0, 1).
    Returns (tokens [N] long, kept [N] bool). See `maximal_coupling_reference`.
    """
    n = prev_tokens.shape[0] if prev_tokens.dim() == 1 else -1
    if n < 0:
        raise ValueError(f"prev_tokens must have shape [N], got {tuple(prev_tokens.shape)}")
    if new_probs.dim() != 2 or new_probs.shape[0] != n or new_probs.shape[1] == 0:
        raise ValueError(f"new_probs must have shape [N, V] with N = {n}, got {tuple(new_probs.shape)}")
    vocab = new_probs.shape[1]
    _check_rows("prev_tokens", prev_tokens, (n,), floating=False)
    _check_rows("prev_probs", prev_probs, (n, vocab), floating=True)
    _check_rows("new_probs", new_probs, (n, vocab), floating=True)
    _check_rows("keep_uniform", keep_uniform, (n,), floating=True)
    _check_rows("residual_uniform", residual_uniform, (n,), floating=True)
    args = (prev_tokens.long().contiguous(), prev_probs.float().contiguous(), new_probs.float().contiguous(),
            keep_uniform.float().contiguous(), residual_uniform.float().contiguous())
    if kernel_backend(prev_tokens.device) != "triton" or n == 0:
        return maximal_coupling_reference(*args)
    require_launchable(_maximal_coupling_kernel, prev_tokens.device)
    tokens = torch.empty(n, dtype=torch.long, device=prev_tokens.device)
    kept = torch.empty(n, dtype=torch.int8, device=prev_tokens.device)
    _maximal_coupling_kernel[(n,)](*args, tokens, kept, vocab,
                                   BLOCK_V=min(triton.next_power_of_2(vocab), _MAX_BLOCK_V))
    return tokens, kept.bool()


# --------------------------------------------------------------------------
# GSD group sums
# --------------------------------------------------------------------------

def rank_window(target_probs: torch.Tensor, tokens: torch.Tensor, half_width: int) -> torch.Tensor:
    """[N, 2h+1] the tokens ranked r−h..r+h in descending target probability, r = rank of `tokens`
    (ties broken by token id); -1 where the window runs off either end of the vocabulary."""
    order = torch.sort(target_probs, dim=1, descending=True, stable=True).indices
    ranks = torch.empty_like(order).scatter_(1, order, torch.arange(order.shape[1], device=order.device)
                                             .expand_as(order).contiguous())
    r = ranks.gather(1, tokens[:, None].long())
    idx = r + torch.arange(-half_width, half_width + 1, device=order.device)
    inside = (idx >= 0) & (idx < order.shape[1])
    return torch.where(inside, order.gather(1, idx.clamp(0, order.shape[1] - 1)), -1)


def group_sums_reference(tokens, candidates, target_probs, draft_probs, embeddings, prob_gap, dist_threshold):
    """Pooled target and draft mass over the group G(x) of each draft token x.

    G(x) = x plus the candidates y with |p(y) − p(x)| < prob_gap and ‖e_y − e_x‖² < dist_threshold.
    """
    valid = candidates >= 0
    safe = candidates.clamp(min=0)
    p_c, q_c = target_probs.gather(1, safe), draft_probs.gather(1, safe)
    p_x = target_probs.gather(1, tokens[:, None])
    dist = (embeddings[safe] - embeddings[tokens][:, None]).pow(2).sum(-1)
    near = ((p_c - p_x).abs() < prob_gap) & (dist < dist_threshold)
    member = valid & (near | (safe == tokens[:, None]))
    return (p_c * member).sum(1), (q_c * member).sum(1)


def group_sums(tokens: torch.Tensor, candidates: torch.Tensor, target_probs: torch.Tensor,
               draft_probs: torch.Tensor, embeddings: torch.Tensor, prob_gap: float,
               dist_threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [N]; candidates [N, C] (-1 padded, from `rank_window`); target/draft probs [N, V];
    embeddings [V, D]. Returns (Σ_G p, Σ_G q), each [N] float32. See `group_sums_reference`."""
    if tokens.dim() != 1:
        raise ValueError(f"tokens must have shape [N], got {tuple(tokens.shape)}")
    n = tokens.shape[0]
    if target_probs.dim() != 2 or target_probs.shape[0] != n:
        raise ValueError(f"target_probs must have shape [N, V] with N = {n}, got {tuple(target_probs.shape)}")
    vocab = target_probs.shape[1]
    if candidates.dim() != 2 or candidates.shape[0] != n:
        raise ValueError(f"candidates must have shape [N, C] with N = {n}, got {tuple(candidates.shape)}")
    _check_rows("draft_probs", draft_probs, (n, vocab), floating=True)
    if embeddings.dim() != 2 or embeddings.shape[0] != vocab:
        raise ValueError(f"embeddings must have shape [V, D] with V = {vocab}, got {tuple(embeddings.shape)}")
    args = (tokens.long().contiguous(), candidates.long().contiguous(), target_probs.float().contiguous(),
            draft_probs.float().contiguous(), embeddings.float().contiguous())
    if kernel_backend(tokens.device) != "triton" or n == 0:
        return group_sums_reference(*args, prob_gap, dist_threshold)
    require_launchable(_group_sums_kernel, tokens.device)
    pooled_p = torch.empty(n, dtype=torch.float32, device=tokens.device)
    pooled_q = torch.empty(n, dtype=torch.float32, device=tokens.device)
    width, dim = candidates.shape[1], embeddings.shape[1]
    _group_sums_kernel[(n,)](*args, pooled_p, pooled_q, vocab, width, dim, float(prob_gap),
                             float(min(dist_threshold, 3.0e38)),
                             BLOCK_C=triton.next_power_of_2(max(width, 1)),
                             BLOCK_D=min(triton.next_power_of_2(dim), _MAX_BLOCK_D))
    return pooled_p, pooled_q
