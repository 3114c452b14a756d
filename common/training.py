"""Small pieces shared by the training scripts of bundled models and heads."""

from __future__ import annotations

import math


def warmup_cosine_lr(step: int, total: int, peak: float, warmup: int = 50) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 0 at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
