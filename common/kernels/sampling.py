"""Inverse-CDF sampling shared by every sampler in the project."""

from __future__ import annotations

import torch


def sample_inverse_cdf(
    probs: torch.Tensor,  # [..., V] non-negative weights, need not sum to 1
    u: torch.Tensor,  # [...] uniforms in [0, 1)
) -> torch.Tensor:  # Long[...]
    """Draw one index per row of `probs` using the given uniforms.

    Taking the uniforms as input (instead of calling torch.multinomial) makes
    sampling reproducible across backends and lets tests drive it exactly.
    """
    if probs.shape[:-1] != u.shape:
        raise ValueError(f"u must have shape {tuple(probs.shape[:-1])} (probs.shape[:-1]), got {tuple(u.shape)}")
    V = probs.shape[-1]
    if V == 0:
        raise ValueError("probs must have a non-empty last dimension")
    if probs.dtype in (torch.float16, torch.bfloat16):
        # A half-precision running sum stalls once it dwarfs single entries,
        # which would bias large vocabularies towards their last tokens.
        probs = probs.float()
    cum = probs.cumsum(-1)
    # Scaling u by the row total (instead of normalising probs) keeps
    # unnormalised weights, e.g. residual distributions, exact.
    thr = (u.to(cum.dtype) * cum[..., -1]).unsqueeze(-1)
    # First index whose cumulative mass exceeds thr: zero-weight entries never
    # raise cum, so they can never be that first index.
    idx = (cum <= thr).sum(-1)
    # Only reachable when u rounds to 1 or the row is all zeros.
    return idx.clamp(max=V - 1)
