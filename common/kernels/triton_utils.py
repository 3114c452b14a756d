"""Triton building blocks shared by the core's kernels and the plugins' kernels.

- `require_launchable(kernel, device)`: fail clearly before launching a kernel
  compiled for GPU on CPU tensors (plain Python; importable without Triton).
- `block_prefix(w, carry, BLOCK_V)`: running prefix sums of one vocabulary
  block, the building block of a blocked inverse CDF.
- `residual_block(...)`: target probabilities and the residual max(p − q, 0)
  of one vocabulary block.
- `sample_residual(...)`: the two-pass inverse CDF over a whole vocabulary
  row, drawing from the residual or from p; the Triton counterpart of
  `residual_distribution` + `sample_inverse_cdf` (`mmspec.common.kernels.sampling`).

They are `@triton.jit` functions, callable from other kernels only; with
TRITON_INTERPRET=1 they run under the interpreter like any kernel.
"""

from __future__ import annotations

import torch

from .backend import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

__all__ = ["require_launchable", "block_prefix", "residual_block", "sample_residual"]


def require_launchable(kernel, device: torch.device) -> None:
    """Raise unless `kernel` can run on tensors on `device`."""
    # The interpret/compile choice is frozen when @triton.jit runs (import of
    # the kernel's module), so a later TRITON_INTERPRET=1 cannot rescue a CPU launch.
    interpreted = type(kernel).__name__ == "InterpretedFunction"
    if device.type != "cuda" and not interpreted:
        raise RuntimeError(
            f"the Triton kernels were compiled for GPU but the tensors are on {device}; "
            "set TRITON_INTERPRET=1 before importing triton/mmspec, or set MMSPEC_KERNELS=torch"
        )


if HAS_TRITON:

    @triton.jit
    def block_prefix(w, carry, BLOCK_V: tl.constexpr):
        """Running prefix sums of one block [BLOCK_V] and the new carry.

        Both passes of an inverse CDF use this, so the total from pass 1 is
        bit-identical to the last prefix of pass 2, which keeps u * total
        strictly inside the CDF.
        """
        prefix = carry + tl.cumsum(w, axis=0)
        last = tl.sum(tl.where(tl.arange(0, BLOCK_V) == BLOCK_V - 1, prefix, 0.0), axis=0)
        return prefix, last

    @triton.jit
    def residual_block(
        target_row,  # pointer to p[0] of one row
        draft_row,  # pointer to q[0] of the same row; read only when HAS_DRAFT_PROBS and rejected
        offs,  # int[BLOCK_V] vocabulary indices of this block
        V,
        rejected,  # whether the row has a draft row to subtract (False: bonus token, q unread)
        draft_token,  # the rejected draft; the residual zeroes it when not HAS_DRAFT_PROBS (one-hot q)
        HAS_DRAFT_PROBS: tl.constexpr,
    ):
        """Target probs p and residual weights max(p − q, 0) for one vocabulary block."""
        in_vocab = offs < V
        p = tl.load(target_row + offs, mask=in_vocab, other=0.0)
        if HAS_DRAFT_PROBS:
            q = tl.load(draft_row + offs, mask=in_vocab & rejected, other=0.0)
            r = tl.maximum(p - q, 0.0)
        else:
            r = tl.where(offs == draft_token, 0.0, p)
        return p, r

    @triton.jit
    def sample_residual(
        target_row,  # pointer to p[0] of one row, V entries
        draft_row,  # pointer to q[0] of the same row (see `residual_block`)
        V,
        rejected,  # True: draw from the residual (p where that is empty); False: draw from p (bonus token)
        draft_token,
        u,  # the row's uniform in [0, 1)
        HAS_DRAFT_PROBS: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        """One inverse-CDF draw over a vocabulary row, in two passes of BLOCK_V entries (int32 index).

        Pass 1 finds the mass of the law drawn from, to scale u; pass 2 counts
        the entries whose prefix sum is <= u * mass.
        """
        total = 0.0
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            pb, rb = residual_block(target_row, draft_row, offs, V, rejected, draft_token, HAS_DRAFT_PROBS)
            _, total = block_prefix(tl.where(rejected, rb, pb), total, BLOCK_V)
        use_residual = (total > 0.0) & rejected
        if (total == 0.0) & rejected:
            # Rare (p == q after rounding): resample from the target instead.
            total = 0.0
            for start in range(0, V, BLOCK_V):
                offs = start + tl.arange(0, BLOCK_V)
                pb, _ = residual_block(target_row, draft_row, offs, V, rejected, draft_token, HAS_DRAFT_PROBS)
                _, total = block_prefix(pb, total, BLOCK_V)
        thr = u * total

        carry = 0.0
        count = 0
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            pb, rb = residual_block(target_row, draft_row, offs, V, rejected, draft_token, HAS_DRAFT_PROBS)
            prefix, carry = block_prefix(tl.where(use_residual, rb, pb), carry, BLOCK_V)
            count += tl.sum(((prefix <= thr) & (offs < V)).to(tl.int32), axis=0)
        return tl.minimum(count, V - 1)
