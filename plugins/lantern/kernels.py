"""LANTERN's neighbourhood pooling: the relaxed target probability of a draft token.

For draft x with latent neighbours n_1 … n_k (nearest first) and target p,
c_j = Σ_{i≤j} p(n_i). The largest prefix J with c_J within the bound is pooled
onto x: p̃(x) = p(x) + c_J. The bound is δ (LANTERN: the relaxed distribution
is within δ of p in total variation) or (λ − 1)·p(x) (LANTERN++: p̃(x) ≤ λ·p(x)).
Because c_j only grows, the largest admissible prefix is a count.

`pooled_probability` returns p̃(x) and J; the torch reference defines the
semantics and the Triton kernel must reproduce them.
"""

from __future__ import annotations

import torch

from mmspec.common.kernels import HAS_TRITON, kernel_backend
from mmspec.common.kernels.triton_utils import require_launchable

if HAS_TRITON:
    import triton
    import triton.language as tl

_MAX_BLOCK_K = 1024


def codebook_neighbours(codebook: torch.Tensor, k: int) -> torch.Tensor:
    """[V, k] the k nearest other codes of every code (L2 in the VQ latent space), nearest first.

    Ties are broken by code id so the table is deterministic.
    """
    vocab = codebook.shape[0]
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= vocab - 1:
        raise ValueError(f"k must be an int between 1 and the codebook size - 1 ({vocab - 1}), got {k!r}")
    e = codebook.detach().double()
    dist = torch.cdist(e, e)
    dist.fill_diagonal_(float("inf"))
    # Stable sort on distance keeps equal distances in id order.
    return torch.sort(dist, dim=1, stable=True).indices[:, :k].contiguous()


def pooled_probability_reference(tokens, neighbours, target_probs, bound_delta: float | None,
                                 bound_lambda: float | None):
    """tokens [N]; neighbours [V, k]; target_probs [N, V]. Exactly one bound is given.
    Returns (p̃(x) [N] float32, J [N] long)."""
    p = target_probs.float()
    p_x = p.gather(1, tokens[:, None]).squeeze(1)
    cum = p.gather(1, neighbours[tokens]).cumsum(1)  # [N, k]
    bound = torch.full_like(p_x, bound_delta) if bound_delta is not None else (bound_lambda - 1.0) * p_x
    within = cum <= bound[:, None]
    count = within.sum(1)
    pooled = torch.where(within, cum, torch.zeros_like(cum)).amax(1)
    return p_x + pooled, count


if HAS_TRITON:

    @triton.jit(do_not_specialize=["V", "K"])
    def _pooled_probability_kernel(tokens_ptr, neighbours_ptr, target_ptr, pooled_ptr, count_ptr, V, K, bound_param,
                                   USE_LAMBDA: tl.constexpr, BLOCK_K: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, BLOCK_K)
        x = tl.load(tokens_ptr + row)
        p_row = target_ptr + row * V.to(tl.int64)
        p_x = tl.load(p_row + x)
        nbr = tl.load(neighbours_ptr + x * K + j, mask=j < K, other=0)
        p_n = tl.load(p_row + nbr, mask=j < K, other=0.0)
        cum = tl.cumsum(p_n, axis=0)
        if USE_LAMBDA:
            bound = (bound_param - 1.0) * p_x
        else:
            bound = bound_param
        within = (cum <= bound) & (j < K)
        tl.store(count_ptr + row, tl.sum(within.to(tl.int64), axis=0))
        tl.store(pooled_ptr + row, p_x + tl.max(tl.where(within, cum, 0.0), axis=0))


def pooled_probability(tokens: torch.Tensor, neighbours: torch.Tensor, target_probs: torch.Tensor, *,
                       delta: float | None = None, lam: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """p̃(x) and the number of pooled neighbours J for each draft token; give `delta` or `lam`."""
    if (delta is None) == (lam is None):
        raise ValueError("give exactly one of delta (LANTERN) and lam (LANTERN++)")
    if delta is not None and not 0 <= delta <= 1:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    if lam is not None and not lam >= 1:
        raise ValueError(f"lam must be >= 1, got {lam!r}")
    if tokens.dim() != 1 or target_probs.dim() != 2 or target_probs.shape[0] != tokens.shape[0]:
        raise ValueError(f"tokens [N] and target_probs [N, V] expected, got {tuple(tokens.shape)} and "
                         f"{tuple(target_probs.shape)}")
    if neighbours.dim() != 2 or neighbours.shape[0] != target_probs.shape[1]:
        raise ValueError(f"neighbours must be [V, k] with V = {target_probs.shape[1]}, got {tuple(neighbours.shape)}")
    args = (tokens.long().contiguous(), neighbours.long().contiguous(), target_probs.float().contiguous())
    n, k = tokens.shape[0], neighbours.shape[1]
    if kernel_backend(tokens.device) != "triton" or n == 0 or k > _MAX_BLOCK_K:
        return pooled_probability_reference(*args, delta, lam)
    require_launchable(_pooled_probability_kernel, tokens.device)
    pooled = torch.empty(n, dtype=torch.float32, device=tokens.device)
    count = torch.empty(n, dtype=torch.long, device=tokens.device)
    _pooled_probability_kernel[(n,)](*args, pooled, count, target_probs.shape[1], k,
                                     float(lam if lam is not None else delta), USE_LAMBDA=lam is not None,
                                     BLOCK_K=triton.next_power_of_2(k))
    return pooled, count
