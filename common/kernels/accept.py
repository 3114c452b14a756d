"""Draft-token acceptance for speculative decoding (greedy and stochastic).

Each op exists three times: a torch reference (`*_reference`), a Triton kernel
with its launcher, and a public entry point that validates its arguments and
dispatches through `kernel_backend`.  The references define the semantics;
the kernels must reproduce them token for token.
"""

from __future__ import annotations

import torch

from .backend import HAS_TRITON, kernel_backend
from .sampling import assemble_tokens, sample_extra_token
from .triton_utils import require_launchable

if HAS_TRITON:
    import triton
    import triton.language as tl

    from .triton_utils import sample_residual

# Caps per-program register use on GPU; larger vocabularies loop over blocks.
_MAX_BLOCK_V = 1024


# --------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------

def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_int(name: str, t: torch.Tensor) -> None:
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of token ids, got dtype {t.dtype}")


def _check_float(name: str, t: torch.Tensor) -> None:
    if not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


def _check_same_device(**tensors: torch.Tensor | None) -> None:
    present = {k: v for k, v in tensors.items() if v is not None}
    devices = {v.device for v in present.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{k} on {v.device}" for k, v in present.items())
        raise ValueError(f"all arguments must be on the same device, got {listing}")


def _validate_lengths(lengths: torch.Tensor | None, B: int, K: int, device) -> None:
    if lengths is None:
        return
    if _shape(lengths) != (B,):
        raise ValueError(f"lengths must have shape [B] = ({B},), got {_shape(lengths)}")
    _check_int("lengths", lengths)
    if lengths.device != device:
        raise ValueError(f"lengths must be on {device}, got {lengths.device}")
    if B:
        low, high = torch.stack([lengths.min(), lengths.max()]).tolist()  # one host read for both bounds
        if low < 0 or high > K:
            raise ValueError(f"lengths must be in [0, K={K}], got values in [{low}, {high}]")


def _validate_greedy(draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> None:
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must have shape [B, K], got {_shape(draft_tokens)}")
    B, K = draft_tokens.shape
    if _shape(target_argmax) != (B, K + 1):
        raise ValueError(
            f"target_argmax must have shape [B, K+1] = {(B, K + 1)} to match draft_tokens "
            f"{_shape(draft_tokens)}, got {_shape(target_argmax)}"
        )
    _check_int("draft_tokens", draft_tokens)
    _check_int("target_argmax", target_argmax)
    _check_same_device(draft_tokens=draft_tokens, target_argmax=target_argmax)


def _validate_speculative(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    uniforms: torch.Tensor,
    residual_uniform: torch.Tensor,
) -> None:
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must have shape [B, K], got {_shape(draft_tokens)}")
    B, K = draft_tokens.shape
    if target_probs.dim() != 3 or _shape(target_probs)[:2] != (B, K + 1):
        raise ValueError(
            f"target_probs must have shape [B, K+1, V] = ({B}, {K + 1}, V), got {_shape(target_probs)}"
        )
    V = target_probs.shape[2]
    if V == 0:
        raise ValueError("target_probs must have a non-empty vocabulary dimension V")
    if draft_probs is not None and _shape(draft_probs) != (B, K, V):
        raise ValueError(f"draft_probs must be None or have shape [B, K, V] = {(B, K, V)}, got {_shape(draft_probs)}")
    if _shape(uniforms) != (B, K):
        raise ValueError(f"uniforms must have shape [B, K] = {(B, K)}, got {_shape(uniforms)}")
    if _shape(residual_uniform) != (B,):
        raise ValueError(f"residual_uniform must have shape [B] = ({B},), got {_shape(residual_uniform)}")
    _check_int("draft_tokens", draft_tokens)
    _check_float("target_probs", target_probs)
    if draft_probs is not None:
        _check_float("draft_probs", draft_probs)
    _check_float("uniforms", uniforms)
    _check_float("residual_uniform", residual_uniform)
    _check_same_device(
        draft_tokens=draft_tokens,
        draft_probs=draft_probs,
        target_probs=target_probs,
        uniforms=uniforms,
        residual_uniform=residual_uniform,
    )


# --------------------------------------------------------------------------
# Torch references
# --------------------------------------------------------------------------

def greedy_accept_reference(
    draft_tokens: torch.Tensor,  # Long[B, K]
    target_argmax: torch.Tensor,  # Long[B, K+1]
    lengths: torch.Tensor | None = None,  # Long[B]: row b has only its first lengths[b] drafts
) -> tuple[torch.Tensor, torch.Tensor]:  # (Long[B], Long[B, K+1])
    K = draft_tokens.shape[1]
    match = draft_tokens == target_argmax[:, :K]  # [B, K]
    if lengths is not None:
        match &= torch.arange(K, device=match.device) < lengths[:, None]
    num_accepted = match.long().cumprod(-1).sum(-1)  # [B]
    extra = target_argmax.long().gather(1, num_accepted[:, None]).squeeze(1)  # correction or bonus token
    return num_accepted, assemble_tokens(draft_tokens, num_accepted, extra)


def _accept_mask(
    draft_tokens: torch.Tensor,  # Long[B, K]
    draft_probs: torch.Tensor | None,  # [B, K, V] or None
    target_probs: torch.Tensor,  # [B, K+1, V]
    uniforms: torch.Tensor,  # [B, K]
) -> torch.Tensor:  # Bool[B, K]
    K = draft_tokens.shape[1]
    idx = draft_tokens.unsqueeze(-1)
    p = target_probs[:, :K].gather(-1, idx).squeeze(-1)
    if draft_probs is None:
        accept = uniforms <= p  # q is one-hot on the drafted token
    else:
        q = draft_probs.gather(-1, idx).squeeze(-1)
        accept = uniforms * q <= p
    # A token the target can never emit must never be accepted, even when
    # u == 0 or q == 0 makes the inequality hold trivially.
    return accept & (p > 0)


def speculative_accept_reference(
    draft_tokens: torch.Tensor,  # Long[B, K]
    draft_probs: torch.Tensor | None,  # float[B, K, V]; None = deterministic drafts
    target_probs: torch.Tensor,  # float[B, K+1, V]
    uniforms: torch.Tensor,  # float[B, K] in [0, 1)
    residual_uniform: torch.Tensor,  # float[B] in [0, 1)
    lengths: torch.Tensor | None = None,  # Long[B]: row b has only its first lengths[b] drafts
) -> tuple[torch.Tensor, torch.Tensor]:  # (Long[B], Long[B, K+1])
    B, K = draft_tokens.shape
    draft_tokens = draft_tokens.long()
    accept = _accept_mask(draft_tokens, draft_probs, target_probs, uniforms)
    limit = torch.full((B,), K, dtype=torch.long, device=draft_tokens.device) if lengths is None else lengths
    accept &= torch.arange(K, device=accept.device) < limit[:, None]
    num_accepted = accept.long().cumprod(-1).sum(-1)  # [B]
    extra = sample_extra_token(target_probs, draft_tokens, draft_probs, num_accepted, residual_uniform, lengths)
    return num_accepted, assemble_tokens(draft_tokens, num_accepted, extra)


# --------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------

if HAS_TRITON:

    @triton.jit(do_not_specialize=["K"])
    def _greedy_accept_kernel(
        draft_ptr,  # Long[B, K], contiguous
        target_ptr,  # Long[B, K+1], contiguous
        lengths_ptr,  # Long[B]; read only when HAS_LENGTHS
        num_accepted_ptr,  # Long[B]
        tokens_ptr,  # Long[B, K+1]
        K,
        HAS_LENGTHS: tl.constexpr,
        BLOCK_K: tl.constexpr,  # >= K + 1
    ):
        row = tl.program_id(0).to(tl.int64)
        k = tl.arange(0, BLOCK_K)
        in_row = k < K + 1
        limit = K
        if HAS_LENGTHS:
            limit = tl.load(lengths_ptr + row).to(tl.int32)
        draft = tl.load(draft_ptr + row * K + k, mask=k < K, other=-1)
        target = tl.load(target_ptr + row * (K + 1) + k, mask=in_row, other=-1)
        # Lane `limit` (and beyond) counts as a mismatch so an all-match row gives n == limit.
        mismatch = (draft != target) | (k >= limit)
        n = tl.min(tl.where(mismatch, k, BLOCK_K), axis=0)
        tokens = tl.where(k <= n, target, -1)
        tl.store(tokens_ptr + row * (K + 1) + k, tokens.to(tl.int64), mask=in_row)
        tl.store(num_accepted_ptr + row, n.to(tl.int64))

    @triton.jit(do_not_specialize=["K", "V"])
    def _speculative_accept_kernel(
        draft_tokens_ptr,  # Long[B, K]
        draft_probs_ptr,  # f32[B, K, V]; any valid pointer when not HAS_DRAFT_PROBS
        target_probs_ptr,  # f32[B, K+1, V]
        uniforms_ptr,  # f32[B, K]
        residual_uniform_ptr,  # f32[B]
        lengths_ptr,  # Long[B]; read only when HAS_LENGTHS
        num_accepted_ptr,  # Long[B]
        tokens_ptr,  # Long[B, K+1]
        K,
        V,
        HAS_DRAFT_PROBS: tl.constexpr,
        HAS_LENGTHS: tl.constexpr,
        BLOCK_K: tl.constexpr,  # >= K + 1
        BLOCK_V: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        V64 = V.to(tl.int64)  # B * K * V can exceed int32
        k = tl.arange(0, BLOCK_K)
        limit = K
        if HAS_LENGTHS:
            limit = tl.load(lengths_ptr + row).to(tl.int32)
        in_draft = k < limit

        # Acceptance test for all drafts at once; n = first rejected position.
        draft = tl.load(draft_tokens_ptr + row * K + k, mask=in_draft, other=0)
        target_rows = target_probs_ptr + row * (K + 1) * V64
        p = tl.load(target_rows + k * V64 + draft, mask=in_draft, other=0.0)
        u = tl.load(uniforms_ptr + row * K + k, mask=in_draft, other=1.0)
        if HAS_DRAFT_PROBS:
            q = tl.load(draft_probs_ptr + (row * K + k) * V64 + draft, mask=in_draft, other=0.0)
            accept = u * q <= p
        else:
            accept = u <= p
        accept = accept & (p > 0.0) & in_draft
        n = tl.min(tl.where(accept, BLOCK_K, k), axis=0)
        draft_n = tl.sum(tl.where(k == n, draft, 0), axis=0)
        has_draft_row = n < limit
        # The residual after a rejection, the target row for the bonus token.
        u_n = tl.load(residual_uniform_ptr + row)
        sampled = sample_residual(target_rows + n * V64, draft_probs_ptr + (row * K + n) * V64, V, has_draft_row,
                                  draft_n, u_n, HAS_DRAFT_PROBS, BLOCK_V)

        tokens = tl.where(k < n, draft, tl.where(k == n, sampled, -1))
        tl.store(tokens_ptr + row * (K + 1) + k, tokens.to(tl.int64), mask=k < K + 1)
        tl.store(num_accepted_ptr + row, n.to(tl.int64))


def _greedy_accept_triton(
    draft_tokens: torch.Tensor,  # Long[B, K]
    target_argmax: torch.Tensor,  # Long[B, K+1]
    lengths: torch.Tensor | None = None,  # Long[B]
) -> tuple[torch.Tensor, torch.Tensor]:
    B, K = draft_tokens.shape
    device = draft_tokens.device
    num_accepted = torch.empty(B, dtype=torch.long, device=device)
    tokens = torch.empty(B, K + 1, dtype=torch.long, device=device)
    if B == 0:
        return num_accepted, tokens
    require_launchable(_greedy_accept_kernel, device)
    _greedy_accept_kernel[(B,)](
        draft_tokens.long().contiguous(),
        target_argmax.long().contiguous(),
        lengths.long().contiguous() if lengths is not None else num_accepted,
        num_accepted,
        tokens,
        K,
        HAS_LENGTHS=lengths is not None,
        BLOCK_K=triton.next_power_of_2(K + 1),
    )
    return num_accepted, tokens


def _speculative_accept_triton(
    draft_tokens: torch.Tensor,  # Long[B, K]
    draft_probs: torch.Tensor | None,  # f32[B, K, V] or None
    target_probs: torch.Tensor,  # f32[B, K+1, V]
    uniforms: torch.Tensor,  # f32[B, K]
    residual_uniform: torch.Tensor,  # f32[B]
    lengths: torch.Tensor | None = None,  # Long[B]
) -> tuple[torch.Tensor, torch.Tensor]:
    B, K = draft_tokens.shape
    V = target_probs.shape[-1]
    device = draft_tokens.device
    num_accepted = torch.empty(B, dtype=torch.long, device=device)
    tokens = torch.empty(B, K + 1, dtype=torch.long, device=device)
    if B == 0:
        return num_accepted, tokens
    require_launchable(_speculative_accept_kernel, device)
    target_probs = target_probs.contiguous()
    has_draft_probs = draft_probs is not None
    _speculative_accept_kernel[(B,)](
        draft_tokens.long().contiguous(),
        draft_probs.contiguous() if has_draft_probs else target_probs,
        target_probs,
        uniforms.contiguous(),
        residual_uniform.contiguous(),
        lengths.long().contiguous() if lengths is not None else num_accepted,
        num_accepted,
        tokens,
        K,
        V,
        HAS_DRAFT_PROBS=has_draft_probs,
        HAS_LENGTHS=lengths is not None,
        BLOCK_K=triton.next_power_of_2(K + 1),
        BLOCK_V=min(triton.next_power_of_2(V), _MAX_BLOCK_V),
    )
    return num_accepted, tokens


# --------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------

def greedy_accept(
    draft_tokens: torch.Tensor,  # Long[B, K]
    target_argmax: torch.Tensor,  # Long[B, K+1]
    lengths: torch.Tensor | None = None,  # Long[B] in [0, K]; None = K for every row
) -> tuple[torch.Tensor, torch.Tensor]:  # (num_accepted Long[B], tokens Long[B, K+1])
    """Accept the longest prefix of drafts that matches the target's argmax.

    tokens[b, :n] are the accepted drafts, tokens[b, n] the target's token at
    the first mismatch (or the bonus token when n == lengths[b]), the rest -1.
    With `lengths`, row b has only its first lengths[b] drafts (ragged chains in one launch).
    """
    _validate_greedy(draft_tokens, target_argmax)
    _validate_lengths(lengths, *draft_tokens.shape, draft_tokens.device)
    if kernel_backend(draft_tokens.device) == "triton":
        return _greedy_accept_triton(draft_tokens, target_argmax, lengths)
    return greedy_accept_reference(draft_tokens.long(), target_argmax.long(),
                                   None if lengths is None else lengths.long())


def speculative_accept(
    draft_tokens: torch.Tensor,  # Long[B, K], ids in [0, V)
    draft_probs: torch.Tensor | None,  # float[B, K, V]; None = deterministic drafts
    target_probs: torch.Tensor,  # float[B, K+1, V]
    uniforms: torch.Tensor,  # float[B, K] in [0, 1)
    residual_uniform: torch.Tensor,  # float[B] in [0, 1)
    lengths: torch.Tensor | None = None,  # Long[B] in [0, K]; None = K for every row
) -> tuple[torch.Tensor, torch.Tensor]:  # (num_accepted Long[B], tokens Long[B, K+1])
    """Leviathan/Chen speculative sampling; rows are independent.

    With `lengths`, row b has only its first lengths[b] drafts: its bonus token comes from
    target_probs[b, lengths[b]] (ragged chains in one launch).

    Draft i is accepted iff uniforms[b, i] * q <= p (and p > 0).  After the
    first rejection at n the token is resampled from max(p - q, 0) (from p if
    that is all zero); if every draft is accepted a bonus token is drawn from
    target_probs[b, K].  Both draws use residual_uniform[b].  Probabilities may
    be unnormalised and are computed in float32 on both backends.
    """
    _validate_speculative(draft_tokens, draft_probs, target_probs, uniforms, residual_uniform)
    _validate_lengths(lengths, *draft_tokens.shape, draft_tokens.device)
    lengths = None if lengths is None else lengths.long()
    # One compute dtype for both backends so they agree token for token.
    draft_tokens = draft_tokens.long()
    target_probs = target_probs.float()
    draft_probs = draft_probs.float() if draft_probs is not None else None
    uniforms = uniforms.float()
    residual_uniform = residual_uniform.float()
    if kernel_backend(draft_tokens.device) == "triton":
        return _speculative_accept_triton(draft_tokens, draft_probs, target_probs, uniforms, residual_uniform,
                                          lengths)
    return speculative_accept_reference(draft_tokens, draft_probs, target_probs, uniforms, residual_uniform,
                                        lengths)
