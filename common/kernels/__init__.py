"""Acceptance kernels and the torch/Triton dispatcher.

Every op has a pure-torch reference and, when Triton is importable, a Triton
kernel.  `kernel_backend` picks one per call so the same code runs on a
CUDA device, on CPU under the Triton interpreter, and on CPU without Triton.
The torch maths every rule shares (residual, extra token, token layout) is in
`sampling`; the Triton building blocks plugins' kernels share are in
`triton_utils`.
"""

from __future__ import annotations

from .backend import HAS_TRITON, kernel_backend
from .sampling import (
    assemble_tokens,
    residual_distribution,
    sample_extra_token,
    sample_inverse_cdf,
)
from .accept import (
    greedy_accept,
    greedy_accept_reference,
    speculative_accept,
    speculative_accept_reference,
)

__all__ = [
    "HAS_TRITON",
    "kernel_backend",
    "sample_inverse_cdf",
    "residual_distribution",
    "sample_extra_token",
    "assemble_tokens",
    "greedy_accept",
    "greedy_accept_reference",
    "speculative_accept",
    "speculative_accept_reference",
]
