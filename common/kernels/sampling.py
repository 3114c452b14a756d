"""Sampling maths shared by every acceptance rule and sampler in the project.

`sample_inverse_cdf` draws with given uniforms; `residual_distribution` is the
law a rejected draft is replaced from; `sample_extra_token` draws the token
after a kept prefix (correction or bonus); `assemble_tokens` lays out what a
step commits. Rules that change the test (grouped, relaxed, floor) reuse them,
so a fix to the residual or the layout is made once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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


def residual_distribution(
    p: torch.Tensor,  # [N, V] target law the draft was tested against (unnormalised is fine)
    q: torch.Tensor | None,  # [N, V] law the draft was drawn from; None = deterministic draft
    draft_token: torch.Tensor | None = None,  # [N] long, the rejected draft; needed when q is None
) -> torch.Tensor:  # [N, V] unnormalised weights for `sample_inverse_cdf`
    """What replaces a rejected draft: max(p − q, 0), or p itself where that is all zero.

    With q None the draft is one-hot, so the residual is p without the draft token. An all-zero
    residual means p == q up to rounding; p is then the right law to resample from.
    """
    if q is None:
        if draft_token is None:
            raise ValueError("residual_distribution needs draft_token when q is None (a deterministic draft)")
        residual = p.scatter(-1, draft_token.long().unsqueeze(-1), 0.0)
    else:
        residual = (p - q).clamp_min(0)
    return torch.where((residual > 0).any(-1, keepdim=True), residual, p)


def sample_extra_token(
    target_probs: torch.Tensor,  # [B, K+1, V] target law after the root and after each draft
    draft_tokens: torch.Tensor,  # [B, K] long
    draft_probs: torch.Tensor | None,  # [B, K, V] laws the drafts were drawn from; None = deterministic drafts
    num_accepted: torch.Tensor,  # [B] long, drafts kept per row
    uniform: torch.Tensor,  # [B] in [0, 1)
    lengths: torch.Tensor | None = None,  # [B] long, drafts row b really has; None = K for every row
    tested_probs: torch.Tensor | None = None,  # [B, V] law the rejected draft was tested against; None = target's
) -> torch.Tensor:  # [B] long
    """The token after the kept prefix, one uniform per row.

    A row that rejected draft n draws from `residual_distribution` at n; a row that kept all its drafts
    draws the bonus token from target_probs[b, n]. `tested_probs` is for rules that test against a
    modified target (a relaxed one): the residual is then taken from that law, the bonus still from p.
    """
    B, K = draft_tokens.shape
    rows = torch.arange(B, device=draft_tokens.device)
    p_n = target_probs[rows, num_accepted]  # [B, V]
    if K == 0:
        return sample_inverse_cdf(p_n, uniform)
    rejected = num_accepted < (K if lengths is None else lengths)  # [B]
    # Rows that kept every draft read a dummy draft row here; `rejected` masks them out.
    at = num_accepted.clamp(max=K - 1)
    q_n = None if draft_probs is None else draft_probs[rows, at]
    residual = residual_distribution(p_n if tested_probs is None else tested_probs, q_n, draft_tokens[rows, at])
    return sample_inverse_cdf(torch.where(rejected[:, None], residual, p_n), uniform)


def assemble_tokens(
    draft_tokens: torch.Tensor,  # [B, K] long
    num_accepted: torch.Tensor,  # [B] long in [0, K]
    extra_tokens: torch.Tensor,  # [B] long, the correction or bonus token of each row
) -> torch.Tensor:  # [B, K+1] long
    """What a step commits per row: the kept drafts, then the extra token, then -1 padding."""
    K = draft_tokens.shape[1]
    pos = torch.arange(K + 1, device=draft_tokens.device)
    drafts = F.pad(draft_tokens.long(), (0, 1), value=-1)  # [B, K+1]
    tokens = torch.where(pos < num_accepted[:, None], drafts, -1)
    return tokens.scatter(1, num_accepted[:, None], extra_tokens.long()[:, None])
