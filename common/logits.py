"""The logits pipeline (temperature, top-k, top-p) and per-row random draws.

The same pipeline is applied to the target and to the draft side, so every
acceptance rule compares *processed* distributions. Temperature 0 means greedy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LogitsPipeline:
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:  # rejects nan too
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None or an int >= 1, got {self.top_k!r}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be None or in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V] raw logits -> [..., V] float32 logits with filtered entries at -inf."""
        logits = logits.float()
        if not self.greedy and self.temperature != 1:
            logits = logits / self.temperature
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            probs = sorted_logits.softmax(-1)
            # Drop a token when the mass strictly before it already reaches top_p (the first always stays).
            drop_sorted = (probs.cumsum(-1) - probs) >= self.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V] processed probabilities (one-hot on the argmax when greedy)."""
        processed = self.process(logits)
        if self.greedy:
            return torch.nn.functional.one_hot(processed.argmax(-1), processed.shape[-1]).float()
        return processed.softmax(-1)


def check_generators(generator, batch_size: int):
    """Validate `generator`: None, one torch.Generator, or a list with one per row."""
    if generator is None or isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, (list, tuple)):
        if len(generator) != batch_size or not all(isinstance(g, torch.Generator) for g in generator):
            raise ValueError(f"generator must be a torch.Generator or a list of {batch_size} of them "
                             f"(one per row), got a list of {len(generator)}")
        return list(generator)
    raise TypeError(f"generator must be None, a torch.Generator or a list of them, got {type(generator).__name__}")


def draw_uniform(generator, batch_size: int, n: int, device) -> torch.Tensor:
    """[B, n] uniforms in [0, 1).

    With a list of generators, row b draws only from generator[b], so a row's
    samples do not depend on which other rows share its batch.
    """
    if isinstance(generator, list):
        return torch.stack([torch.rand(n, generator=g, device=g.device) for g in generator]).to(device)
    gen_device = generator.device if generator is not None else device
    return torch.rand(batch_size, n, generator=generator, device=gen_device).to(device)


def draw_ragged_uniforms(generator, counts: torch.Tensor, width: int, device) -> torch.Tensor:
    """[B, width] uniforms where row b draws exactly counts[b] (<= width) of them; the rest are 0.

    With a list of generators row b's draws come from generator[b] only and their number depends on row b
    alone, so ragged rows (different draft lengths) sample as if each were decoded by itself."""
    counts_list = counts.tolist()
    out = torch.zeros(len(counts_list), width)
    if isinstance(generator, list):
        for b, (g, n) in enumerate(zip(generator, counts_list)):
            out[b, :n] = torch.rand(n, generator=g, device=g.device).cpu()
    else:
        flat = draw_uniform(generator, 1, sum(counts_list), device)[0].cpu().split(counts_list)
        for b, row in enumerate(flat):
            out[b, : row.numel()] = row
    return out.to(device)
