"""Which kernels run: the torch reference or Triton (`kernel_backend`), and whether Triton is installed.

Its own module so the kernels beside it import it without importing the package that re-exports them.
"""

from __future__ import annotations

import importlib.util
import os

import torch

# find_spec instead of `import triton`: importing triton here would freeze the
# interpret/compile decision before callers had a chance to set TRITON_INTERPRET.
HAS_TRITON = importlib.util.find_spec("triton") is not None

_ENV_VAR = "MMSPEC_KERNELS"
_ALLOWED = ("auto", "torch", "triton")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernel_backend(device: torch.device | str) -> str:
    """Return "torch" or "triton" for ops whose tensors live on `device`.

    Controlled by the MMSPEC_KERNELS env var (read on every call so tests and
    benchmarks can flip it): "auto" (default), "torch" or "triton".
    """
    choice = os.environ.get(_ENV_VAR, "auto").strip().lower()
    if choice not in _ALLOWED:
        raise ValueError(
            f"{_ENV_VAR}={os.environ.get(_ENV_VAR)!r} is not valid; expected one of {', '.join(_ALLOWED)}"
        )
    device = torch.device(device)
    if choice == "torch":
        return "torch"
    if choice == "auto":
        if HAS_TRITON and (device.type == "cuda" or _interpreting()):
            return "triton"
        return "torch"
    # Explicit "triton": fail loudly rather than silently running the reference.
    if not HAS_TRITON:
        raise RuntimeError(f"{_ENV_VAR}=triton but the `triton` package is not installed")
    if device.type != "cuda" and not _interpreting():
        raise RuntimeError(
            f"{_ENV_VAR}=triton on a {device.type} device needs the Triton interpreter: "
            "set TRITON_INTERPRET=1 before triton is imported (i.e. before importing mmspec kernels)"
        )
    return "triton"
