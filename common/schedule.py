"""Schedules: decoding without a verification step, where a fixed plan says what each forward fills.

A `Schedule` is a list of `ScheduleStep`s over generated-token indices
(0 … N−1; index −1 is the prompt's last token). Each step feeds some tokens at
their own positions and samples some new tokens from the outputs. Because the
plan does not depend on the sampled tokens, every row of a batch follows it in
lockstep without waiting on anything, and the forward count is known up front.

`ScheduledDecoder` runs a schedule on any `ARModel` (so CFG comes from
`CFGModel`). Attention is the adapter's usual rule: a query sees the live tokens
at lower positions. A token that has not been generated yet is simply absent;
nothing attends to an unwritten slot.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from .decoder import GenerationOutput, begin_generation
from .kernels import sample_inverse_cdf
from .logits import LogitsPipeline, draw_uniform
from .model import ARModel


@dataclass
class ScheduleStep:
    feed: list[int]  # generated index whose position each input takes (-1: the prompt's last token)
    source: list[int]  # generated index whose token each input carries (= feed, or a placeholder's source)
    query_only: list[bool]  # input is fed for its output only and never kept (a placeholder)
    sample_from: list[int]  # input slot whose output gives each new token
    sample_index: list[int]  # generated index of each new token


@dataclass
class Schedule:
    num_tokens: int
    steps: list[ScheduleStep] = field(default_factory=list)

    def check(self) -> None:
        """Every index is sampled exactly once, and only tokens already sampled are fed."""
        seen = set()
        for t, step in enumerate(self.steps):
            lengths = {len(step.feed), len(step.source), len(step.query_only)}
            if len(lengths) != 1 or len(step.sample_from) != len(step.sample_index):
                raise ValueError(f"schedule step {t} has inconsistent field lengths")
            for src in step.source:
                if src >= 0 and src not in seen:
                    raise ValueError(f"schedule step {t} feeds token {src} before it is sampled")
            for index in step.sample_index:
                if index in seen or not 0 <= index < self.num_tokens:
                    raise ValueError(f"schedule step {t} samples token {index} twice or out of range")
                seen.add(index)
        if len(seen) != self.num_tokens:
            raise ValueError(f"schedule samples {len(seen)} of {self.num_tokens} tokens")


class ScheduledDecoder:
    """Run a `Schedule`: one target forward per step, one sample per scheduled new token."""

    def __init__(self, target: ARModel, schedule: Schedule, logits: LogitsPipeline | None = None,
                 pad_token_id: int = -1):
        schedule.check()
        self.target = target
        self.schedule = schedule
        self.logits = logits or LogitsPipeline()
        self.pad_token_id = pad_token_id

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int, generator=None, prefill_input: tuple | None = None,
                 callback=None) -> GenerationOutput:
        """Same contract as `SpeculativeDecoder.generate`; max_new_tokens must equal the schedule's length."""
        if max_new_tokens != self.schedule.num_tokens:
            raise ValueError(f"max_new_tokens ({max_new_tokens}) must equal the schedule's "
                             f"{self.schedule.num_tokens} tokens")
        begun = begin_generation(self.target, input_ids, attention_mask, prefill_input, generator,
                                 max_new_tokens=max_new_tokens)
        ids, mask, state, generator, stats, start = (begun.ids, begun.mask, begun.state, begun.generator,
                                                     begun.stats, begun.start_time)
        batch, device = ids.shape[0], self.target.device

        last_prompt = ids[:, -1]
        first_position = mask.sum(1)  # position of generated token 0, per row
        out = torch.full((batch, max_new_tokens), self.pad_token_id, dtype=torch.long, device=device)
        for t, step in enumerate(self.schedule.steps):
            source = torch.tensor(step.source, device=device)
            tokens = torch.where(source[None] < 0, last_prompt[:, None], out[:, source.clamp(min=0)])
            positions = first_position[:, None] + torch.tensor(step.feed, device=device)[None]
            query_only = None
            if any(step.query_only):
                query_only = torch.tensor(step.query_only, device=device)[None].expand(batch, -1)
            with stats.timer("verify", device):
                logits = self.target.forward(state, tokens, positions, query_only=query_only).logits
                stats.count_target_forward(tokens.shape[1])
            with stats.timer("accept", device):
                probs = self.logits.probs(logits[:, step.sample_from])  # [B, S, V]
                uniforms = draw_uniform(generator, batch, probs.shape[1], device)
                new = probs.argmax(-1) if self.logits.greedy else sample_inverse_cdf(probs, uniforms)
                out[:, step.sample_index] = new
            stats.record_step(torch.full((batch,), len(step.sample_index), dtype=torch.long),
                              len(step.sample_index) - 1)
            if callback is not None:
                callback(t, {"rows": torch.arange(batch), "tokens": new,
                             "num_accepted": torch.full((batch,), len(step.sample_index) - 1)})
        stats.tokens = batch * max_new_tokens
        steps = len(self.schedule.steps)  # every row takes part in every step and commits every token
        stats.row_forwards, stats.row_committed = [steps] * batch, [max_new_tokens] * batch
        stats.time_total_s = time.perf_counter() - start
        lengths = torch.full((batch,), max_new_tokens, dtype=torch.long, device=device)
        return GenerationOutput(sequences=out, lengths=lengths, stats=stats)
