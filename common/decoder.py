"""The `Decoder` protocol and `SpeculativeDecoder`, the draft/verify loop most plugins run.

    draft -> verify (one target forward) -> accept -> commit / roll back -> stats

Rows advance independently: each keeps its own accepted length and position,
finished rows leave the batch, and nothing waits for the slowest row. With no
drafter (K = 0) the same loop is plain autoregressive decoding.

Every decoder a plugin builds implements `Decoder`: this loop, the schedule
decoder (`mmspec.common.schedule`), the verified next-set decoder of `zipar`,
and decoders that wrap this loop (`ctc_draft`'s gate).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from .accept import AcceptRule, Draft, GreedyMatch, SpeculativeSampling
from .draft import Drafter, StepContext
from .logits import LogitsPipeline, check_generators
from .model import ARModel, left_align
from .stats import DecodeStats


@dataclass
class DecodeStart:
    """What every decode loop has after the prompt: the prefilled target state, ready for decoding."""
    ids: torch.Tensor  # [B, T] left-padded prompt ids on the target's device
    mask: torch.Tensor  # [B, T] bool
    state: object  # the target's DecodeState
    generator: object  # validated: None, a torch.Generator, or one per row
    stats: DecodeStats
    start_time: float


def check_position_budget(target: ARModel, mask: torch.Tensor, max_new_tokens: int) -> None:
    """Refuse, before any forward, a call whose positions would pass the target's `max_positions`: the last
    prompt token of a row of length n sits at n - 1 and the decode loop feeds up to n + max_new_tokens - 2."""
    limit = target.max_positions
    if limit is None or not mask.shape[0]:
        return
    longest = int(mask.sum(1).max())
    if longest + max_new_tokens - 1 > limit:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) after a {longest}-token prompt needs positions up to "
                         f"{longest + max_new_tokens - 2}, but the model takes {limit} positions (0..{limit - 1}): "
                         f"lower max_new_tokens to at most {limit - longest + 1}")


def begin_generation(target: ARModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     prefill_input: tuple | None, generator, first_rows: int | None = None,
                     max_new_tokens: int | None = None) -> DecodeStart:
    """Prefill all prompt tokens but the last one: every loop feeds the last prompt token with its first
    forward, so that forward already produces (or verifies) new tokens.

    `prefill_input` lets an adapter that needs more than ids (CFG: 2B rows) receive its own prefill
    arguments; its last column must be the same tokens as input_ids'. first_rows: prefill only the first
    rows (continuous batching admits the others later with `prefill_rows`); ids and mask keep every row."""
    ids, mask, _ = left_align(input_ids, attention_mask)
    if max_new_tokens is not None:
        check_position_budget(target, mask, max_new_tokens)
    batch, device = ids.shape[0], target.device
    ids, mask = ids.to(device), mask.to(device)
    generator = check_generators(generator, batch)
    stats = DecodeStats(num_rows=batch)
    start_time = time.perf_counter()
    rows = torch.arange(batch if first_rows is None else first_rows)
    with stats.timer("prefill", device):
        state, fed = prefill_rows(target, ids, mask, prefill_input, rows)
    stats.prefill_nfe += fed
    return DecodeStart(ids, mask, state, generator, stats, start_time)


def prefill_rows(target: ARModel, ids: torch.Tensor, mask: torch.Tensor, prefill_input: tuple | None,
                 rows: torch.Tensor) -> tuple[object, bool]:
    """A new target state holding requests `rows` (indices into the left-aligned ids / mask) prefilled up to
    their last prompt token; returns it and whether a forward ran."""
    if prefill_input is None:
        pre_ids, pre_mask = ids[rows.to(ids.device)], mask[rows.to(ids.device)]
    else:
        aligned = left_align(*prefill_input[:2])[:2]
        if rows.numel() != ids.shape[0]:
            aligned = target.prefill_input_rows(aligned, rows.to(aligned[0].device), ids.shape[0])
        pre_ids, pre_mask = aligned
    device = target.device
    target.set_prefill_requests(rows)
    state, pre_out = target.prefill(pre_ids[:, :-1].to(device), pre_mask[:, :-1].to(device))
    target.begin_decode(state, pre_ids[:, -1].to(device))
    return state, pre_out is not None


def check_max_batch_size(max_batch_size) -> None:
    if max_batch_size is not None and (isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int)
                                       or max_batch_size < 1):
        raise ValueError(f"max_batch_size must be an int >= 1 or None, got {max_batch_size!r}")


@dataclass
class ArrivingRows:
    """Requests that join a running `generate` call, e.g. branches a running row forks from its output: their
    prompts [n, T] (any padding side with attention_mask) and, when the call runs one generator per row,
    one for each of them (else None: they share the call's generator)."""
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    generator: list | None = None


def _pad_left(ids: torch.Tensor, mask: torch.Tensor, width: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-aligned prompts widened to `width` columns with masked `pad` ids (a valid id: adapters embed them)."""
    extra = width - ids.shape[1]
    if extra <= 0:
        return ids, mask
    return (torch.nn.functional.pad(ids, (extra, 0), value=pad), torch.nn.functional.pad(mask, (extra, 0)))


@dataclass
class Requests:
    """Every request of one decode call, in call order (the given rows, then arrivals): prompts, generators, what
    each has produced so far and the ones still waiting for a place in the batch. Grows when requests arrive."""

    ids: torch.Tensor  # [N, T] long; left-aligned prompts
    mask: torch.Tensor  # [N, T] bool
    generator: object  # None, one torch.Generator, or a list of N (request i draws from generator[i] only)
    out: torch.Tensor  # [N, max_new_tokens] long; generated tokens, padded with the decoder's pad_token_id
    produced: torch.Tensor  # [N] long; tokens generated so far (EOS included)
    forwards: torch.Tensor  # [N] long; decode steps each request took part in (no host sync to count)
    committed: torch.Tensor  # [N] long; tokens committed to each (before EOS / length cuts)
    waiting: list[int]  # requests not admitted yet, in call order

    @classmethod
    def start(cls, ids, mask, generator, width: int, max_new_tokens: int, pad_token_id: int) -> "Requests":
        """The call's requests, the first `width` admitted at once."""
        total, device = ids.shape[0], ids.device
        zeros = lambda: torch.zeros(total, dtype=torch.long, device=device)  # noqa: E731
        return cls(ids, mask, generator, torch.full((total, max_new_tokens), pad_token_id, dtype=torch.long,
                                                    device=device),
                   zeros(), zeros(), zeros(), list(range(width, total)))

    def generators(self, rows: torch.Tensor):
        """The generator argument for requests `rows` (one per row when the call has one per request)."""
        return [self.generator[i] for i in rows.tolist()] if isinstance(self.generator, list) else self.generator

    def enlist(self, arrived: "ArrivingRows", pad_token_id: int) -> None:
        """Add arriving requests after the others, waiting to be admitted as places allow."""
        new_ids, new_mask, _ = left_align(arrived.input_ids, arrived.attention_mask)
        n, device = new_ids.shape[0], self.ids.device
        if isinstance(self.generator, list) != (arrived.generator is not None):
            raise ValueError("arriving rows need one generator each exactly when the call has one per row")
        if arrived.generator is not None and len(arrived.generator) != n:
            raise ValueError(f"{n} arriving rows came with {len(arrived.generator)} generators")
        width = max(self.ids.shape[1], new_ids.shape[1])
        ids, mask = _pad_left(self.ids, self.mask, width, 0)
        new_ids, new_mask = _pad_left(new_ids.to(device), new_mask.to(device), width, 0)
        self.waiting.extend(range(ids.shape[0], ids.shape[0] + n))
        grow = lambda t, fill: torch.cat([t, t.new_full((n, *t.shape[1:]), fill)])  # noqa: E731
        self.ids, self.mask = torch.cat([ids, new_ids]), torch.cat([mask, new_mask])
        if arrived.generator is not None:
            self.generator = self.generator + list(arrived.generator)
        self.out, self.produced = grow(self.out, pad_token_id), grow(self.produced, 0)
        self.forwards, self.committed = grow(self.forwards, 0), grow(self.committed, 0)

    def finished(self, index: torch.Tensor) -> "FinishedRows":
        return FinishedRows(index, self.out[index], self.produced[index], self.forwards[index], self.committed[index])


@dataclass
class FinishedRows:
    """The rows that finished at one decode step: the step callback's info["finished"] (None on steps where none
    did), so a caller can hand each request's output on before the whole call returns (`mmspec batch` writes
    each sample as it finishes). Built only on such steps, and only when a callback is given."""

    index: torch.Tensor  # [F] long; each row's index in the call (input order; arrivals after)
    sequences: torch.Tensor  # [F, max_new_tokens] long; generated tokens, padded with pad_token_id
    lengths: torch.Tensor  # [F] long; generated tokens per row (EOS included)
    forwards: torch.Tensor  # [F] long; decode steps each row took part in
    committed: torch.Tensor  # [F] long; tokens committed to each row (before EOS / length cuts)

    def renumbered(self, call_index: torch.Tensor) -> "FinishedRows":
        """The same rows, numbered by `call_index` [N] (row i of this decode is row call_index[i] of the call)."""
        return FinishedRows(call_index.to(self.index.device)[self.index], self.sequences, self.lengths,
                            self.forwards, self.committed)

    def rows(self) -> list[tuple[int, list[int], int, int]]:
        """(index, tokens, forwards, committed) per row, on the host."""
        index, lengths, forwards, committed = torch.stack(
            [self.index, self.lengths, self.forwards, self.committed]).tolist()
        return [(i, self.sequences[f, :n].tolist(), fw, c)
                for f, (i, n, fw, c) in enumerate(zip(index, lengths, forwards, committed))]


@dataclass
class GenerationOutput:
    sequences: torch.Tensor  # [B, max_new_tokens] long; generated tokens, padded with pad_token_id
    lengths: torch.Tensor  # [B] long; generated tokens per row (EOS included)
    stats: DecodeStats = field(default_factory=DecodeStats)

    def __post_init__(self) -> None:
        self.stats.settle()  # the decode loop records its steps lazily; the caller reads settled figures

    def tolist(self) -> list[list[int]]:
        return [self.sequences[b, : int(n)].tolist() for b, n in enumerate(self.lengths)]


@runtime_checkable
class Decoder(Protocol):
    """What a pipeline runs: prompts in, generated tokens and their statistics out.

    input_ids [B, T] (any padding side with attention_mask [B, T]); `prefill_input` lets an adapter that
    needs more than ids (CFG: 2B rows) receive its own prefill arguments, its last column the same tokens
    as input_ids'. generator: None, one torch.Generator, or one per row (then row b's randomness depends
    on generator b only). callback(step, info) after every step, info = {"rows", "tokens", "num_accepted"}; a
decoder that retires rows one by one adds "finished" (`FinishedRows`, or None on steps where no row finished).

    A decoder that also takes `max_batch_size=` decodes at most that many rows at once and, as rows
    finish, admits the waiting ones into their places (continuous batching); `refill_blocker()` returns
    None when it can, else why not (`Pipeline.build_decoder` then wraps it in `BatchesInTurn`, which runs
    batches one after another, so every decoder a pipeline runs takes the whole signature). Such a
    decoder also takes `arrivals=`: a callable (step, info) -> `ArrivingRows` | None, asked after every step
    (info as the callback's, plus "sequences" [N, max_new_tokens] and "lengths" [N], every request's output
    so far), whose rows join the call as new requests after the given ones, in arrival order.
    """

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int, generator=None, prefill_input: tuple | None = None,
                 callback=None) -> "GenerationOutput":
        ...


def renumbered_callback(callback, call_rows: torch.Tensor):
    """`callback` for a decode over some of a call's rows (row i of the decode is row call_rows[i] of the call):
    it sees "rows" and "finished" numbered in the whole call. None stays None."""
    if callback is None:
        return None

    def on_step(step, info):
        done = info.get("finished")
        callback(step, {**info, "rows": call_rows.to(info["rows"].device)[info["rows"]],
                        "finished": None if done is None else done.renumbered(call_rows)})
    return on_step


def refill_blocker(decoder) -> str | None:
    """None when `decoder` does continuous batching (takes `max_batch_size=` and `arrivals=`), else why it does
    not. A decoder says so with its `refill_blocker()`; one that has none (a third party's, written to the bare
    `generate` contract) runs a batch until its last row finishes."""
    check = getattr(decoder, "refill_blocker", None)  # optional in the Decoder protocol
    if check is None:
        return f"{type(decoder).__name__} runs a batch until its last row finishes"
    return check()


class BatchesInTurn:
    """A decoder that cannot admit rows into a running batch, given the whole `Decoder` signature: with
    max_batch_size below the number of rows it decodes them in batches of that size, one after another (each
    row's output is what decoding it alone gives); arrivals= is refused with the reason. `Pipeline.build_decoder`
    wraps such decoders in it once, so a pipeline runs every decoder with one call."""

    def __init__(self, decoder, target: ARModel, blocker: str):
        self.decoder, self.target, self.blocker = decoder, target, blocker

    def refill_blocker(self) -> str:
        return self.blocker

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int, generator=None, prefill_input: tuple | None = None, callback=None,
                 max_batch_size: int | None = None, arrivals=None) -> "GenerationOutput":
        check_max_batch_size(max_batch_size)
        if arrivals is not None:
            raise ValueError(f"arrivals= needs continuous batching, but {self.blocker}")
        total = input_ids.shape[0]
        if max_batch_size is None or max_batch_size >= total:
            return self.decoder.generate(input_ids, attention_mask, max_new_tokens=max_new_tokens,
                                         generator=generator, prefill_input=prefill_input, callback=callback)
        generator = check_generators(generator, total)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
        parts, stats = [], DecodeStats()
        for start in range(0, total, max_batch_size):
            rows = torch.arange(start, min(start + max_batch_size, total))
            part_input = None if prefill_input is None else \
                self.target.prefill_input_rows(prefill_input, rows.to(prefill_input[0].device), total)
            parts.append(self.decoder.generate(
                input_ids[rows], attention_mask[rows], max_new_tokens=max_new_tokens,
                generator=[generator[i] for i in rows.tolist()] if isinstance(generator, list) else generator,
                prefill_input=part_input, callback=renumbered_callback(callback, rows)))
            stats = stats.merge(parts[-1].stats)
        stats.num_rows = total
        return GenerationOutput(sequences=torch.cat([p.sequences for p in parts]),
                                lengths=torch.cat([p.lengths for p in parts]), stats=stats)


def autoregressive_decoder(request) -> "SpeculativeDecoder":
    """Plain AR for a `DecodeRequest`: the draft/verify loop with no drafter (one token per target forward).
    What a pipeline runs with no plugin attached, and what the `ar` plugin builds."""
    rule = GreedyMatch() if request.logits.greedy else SpeculativeSampling()
    return SpeculativeDecoder(request.target, None, rule, request.logits, num_draft_tokens=0,
                              eos_token_id=request.eos_token_id, pad_token_id=request.pad_token_id)


class SpeculativeDecoder:
    def __init__(self, target: ARModel, drafter: Drafter | None = None, accept_rule: AcceptRule | None = None,
                 logits: LogitsPipeline | None = None, num_draft_tokens: int = 0,
                 eos_token_id: int | None = None, pad_token_id: int = -1):
        self.target = target
        self.drafter = drafter
        self.logits = logits or LogitsPipeline()
        self.accept_rule = accept_rule or (GreedyMatch() if self.logits.greedy else SpeculativeSampling())
        if not isinstance(num_draft_tokens, int) or num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be an int >= 0, got {num_draft_tokens!r}")
        if drafter is None and num_draft_tokens:
            raise ValueError("num_draft_tokens > 0 needs a drafter")
        drafts_trees = getattr(drafter, "tree", None) is not None or getattr(drafter, "dynamic", None) is not None
        if drafter is not None and num_draft_tokens == 0 and not drafts_trees:
            raise ValueError("num_draft_tokens must be >= 1 when a chain drafter is given")
        draft_vocab = getattr(drafter, "vocab_size", None)
        if draft_vocab is not None and draft_vocab != target.vocab_size:
            raise ValueError(f"drafter vocabulary ({draft_vocab}) does not match the target's ({target.vocab_size})")
        self.num_draft_tokens = num_draft_tokens
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        # Continuous batching admits waiting rows once this many places are free (or the batch ran empty). 1:
        # at once. A drafter whose first draft per row is much wider than its later ones (ctc_draft proposes a
        # whole hypothesis) raises it, so admitted rows share their wide first pass instead of each widening
        # another step for the whole batch (on a CPU a step costs in proportion to rows x width).
        self.admit_at_least = 1

    def refill_blocker(self) -> str | None:
        """None when this decoder can admit waiting rows into a running batch, else the reason it cannot."""
        if not self.target.can_append_rows():
            return f"the target adapter {type(self.target).__name__} cannot append rows to its state"
        if self.drafter is not None and type(self.drafter).admit is Drafter.admit:
            return f"the drafter {type(self.drafter).__name__} cannot admit rows into a running batch"
        return None

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int, generator=None, prefill_input: tuple | None = None,
                 callback=None, max_batch_size: int | None = None, arrivals=None) -> GenerationOutput:
        """Generate up to max_new_tokens per row (the `Decoder` contract). max_batch_size: decode at most
        that many rows at once, admitting waiting rows as others finish; arrivals: requests that join while
        the call runs (see `Decoder`)."""
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        total = input_ids.shape[0]
        check_max_batch_size(max_batch_size)
        if arrivals is not None and self.refill_blocker() is not None:
            raise ValueError(f"arrivals= needs continuous batching, but {self.refill_blocker()}")
        if max_batch_size is not None:
            blocker = self.refill_blocker() if max_batch_size < total else None
            if blocker is not None:
                raise ValueError(f"max_batch_size={max_batch_size} < {total} rows needs continuous batching, "
                                 f"but {blocker}")
        limit = max_batch_size if max_batch_size is not None else (total if arrivals is None else 2 ** 62)
        width = min(limit, total)
        begun = begin_generation(self.target, input_ids, attention_mask, prefill_input, generator, width,
                                 max_new_tokens)
        ids, mask, state, generator, stats, start = (begun.ids, begun.mask, begun.state, begun.generator,
                                                     begun.stats, begun.start_time)
        device = self.target.device
        if self.drafter is not None:
            self.drafter.begin(ids[:width, :-1], mask[:width, :-1])
        req = Requests.start(ids, mask, generator, width, max_new_tokens, self.pad_token_id)
        rows = torch.arange(width, device=device)  # the request each active row decodes
        ctx = self._context(rows, req, max_new_tokens)
        step = 0
        while rows.numel():
            draft = self._draft(ctx, stats)
            target_probs, verify_output = self._verify(state, ctx, draft, stats)
            with stats.timer("accept", device):
                acc = self.accept_rule(draft, target_probs, ctx.generator)
            committed = acc.num_accepted + 1
            static_tree = draft.tree is not None and draft.tree.depth.dim() == 1  # one tree for every row
            stats.record_step(committed, draft.num_tokens if draft.tree is None else draft.tree.max_depth,
                              draft.lengths, acc.path_nodes if static_tree else None,
                              draft.tree.num_nodes if static_tree else 0)
            req.forwards[rows] += 1
            req.committed[rows] += committed
            with stats.timer("accept", device):
                self._keep(state, draft, acc)
                self.target.crop(state, ctx.positions + committed)
                finished = self._write(req.out, req.produced, rows, acc, max_new_tokens)
                remaining = max_new_tokens - req.produced[rows]
                # The step's one host sync: whether rows finished, the longest accepted run (drafters size
                # their rollback with it) and a lower bound of what the rows still need (sizes the next verify).
                any_finished, acc.max_accepted, ctx.min_remaining = torch.stack([
                    finished.any().long(), acc.num_accepted.max(),
                    remaining.masked_fill(finished, max_new_tokens).min()]).tolist()
                if self.drafter is not None:
                    self.drafter.commit(ctx, acc, target_probs, verify_output)
                ctx.last_tokens, ctx.positions, ctx.remaining = acc.next_tokens, ctx.positions + committed, remaining
                if callback is not None:
                    callback(step, {"rows": rows, "tokens": acc.tokens, "num_accepted": acc.num_accepted,
                                    "finished": req.finished(rows[finished]) if any_finished else None})
                if arrivals is not None:
                    arrived = arrivals(step, {"rows": rows, "tokens": acc.tokens, "num_accepted": acc.num_accepted,
                                              "sequences": req.out, "lengths": req.produced})
                    if arrived is not None and arrived.input_ids.shape[0]:
                        req.enlist(arrived, self.pad_token_id)
                        stats.num_rows = req.ids.shape[0]
                if any_finished:
                    keep = (~finished).nonzero().flatten()
                    rows = rows[keep]
                    self.target.select_rows(state, keep)
                    if self.drafter is not None:
                        self.drafter.select_rows(keep)
                    ctx.last_tokens, ctx.positions = ctx.last_tokens[keep], ctx.positions[keep]
                    ctx.remaining, ctx.requests = ctx.remaining[keep], ctx.requests[keep]
                    if isinstance(ctx.generator, list):
                        ctx.generator = [ctx.generator[i] for i in keep.tolist()]
                free = limit - rows.numel()
                if req.waiting and free > 0 and (free >= min(self.admit_at_least, len(req.waiting))
                                                 or not rows.numel()):
                    rows, ctx = self._admit(state, ctx, rows, req, limit, prefill_input, max_new_tokens, stats)
            step += 1
        stats.tokens = int(req.produced.sum())
        stats.row_forwards, stats.row_committed = torch.stack([req.forwards, req.committed]).tolist()
        stats.time_total_s = time.perf_counter() - start
        return GenerationOutput(sequences=req.out, lengths=req.produced, stats=stats)

    def _context(self, rows: torch.Tensor, req: Requests, max_new_tokens: int) -> StepContext:
        """The step context of requests `rows` before their first step."""
        return StepContext(last_tokens=req.ids[rows, -1], positions=req.mask[rows].sum(1) - 1,
                           num_draft_tokens=self.num_draft_tokens, logits=self.logits,
                           generator=req.generators(rows),
                           remaining=torch.full((rows.numel(),), max_new_tokens, dtype=torch.long,
                                                device=rows.device), min_remaining=max_new_tokens,
                           requests=rows)

    def _admit(self, state, ctx: StepContext, rows, req: Requests, width: int, prefill_input, max_new_tokens: int,
               stats: DecodeStats):
        """Prefill the next waiting requests into the places finished rows left (continuous batching)."""
        take = torch.tensor(req.waiting[: width - rows.numel()], dtype=torch.long)
        del req.waiting[: take.numel()]
        with stats.timer("prefill", self.target.device):
            new_state, fed = prefill_rows(self.target, req.ids, req.mask, prefill_input, take)
        stats.prefill_nfe += fed
        self.target.append_rows(state, new_state)
        take = take.to(rows.device)
        new_ctx = self._context(take, req, max_new_tokens)
        if self.drafter is not None:
            self.drafter.admit(req.ids[take, :-1], req.mask[take, :-1], new_ctx)
        stats.add("admitted_rows", take.numel())
        merged = StepContext(
            last_tokens=torch.cat([ctx.last_tokens, new_ctx.last_tokens]),
            positions=torch.cat([ctx.positions, new_ctx.positions]), num_draft_tokens=self.num_draft_tokens,
            logits=self.logits, generator=ctx.generator + new_ctx.generator if isinstance(req.generator, list)
            else req.generator, remaining=torch.cat([ctx.remaining, new_ctx.remaining]),
            min_remaining=min(ctx.min_remaining, new_ctx.min_remaining),
            requests=torch.cat([ctx.requests, new_ctx.requests]))
        return torch.cat([rows, take]), merged

    def _draft(self, ctx: StepContext, stats: DecodeStats) -> Draft:
        batch = ctx.last_tokens.shape[0]
        if self.drafter is None:
            return Draft(tokens=torch.empty(batch, 0, dtype=torch.long, device=ctx.last_tokens.device))
        with stats.timer("draft", ctx.last_tokens.device):
            draft = self.drafter.propose(ctx)
        stats.drafter_nfe += draft.forwards
        if self.accept_rule.needs_draft_probs and draft.tree is None and draft.probs is None \
                and not self.logits.greedy:
            raise ValueError(f"accept rule {self.accept_rule.name!r} needs draft probabilities")
        return draft

    def _verify(self, state, ctx: StepContext, draft: Draft, stats: DecodeStats):
        """One target forward on [last, drafts...]; returns processed probs [B, K+1, V] and the raw output.

        Drafts past a row's last needed position (a window longer than what the row has left)
        are fed as padding at a clamped position: their outputs are never used, and a model
        with a fixed position range (an image grid) is never asked for a position beyond it.
        """
        tokens = torch.cat([ctx.last_tokens[:, None], draft.tokens], 1)
        with stats.timer("verify", ctx.last_tokens.device):
            if draft.tree is None:
                offsets = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
            else:
                offsets = draft.tree.depth.to(tokens.device).expand_as(tokens)
            needed = offsets < ctx.remaining[:, None]
            if draft.lengths is not None:  # a ragged chain: drafts past a row's length are padding
                needed &= offsets <= draft.lengths.to(offsets.device)[:, None]
            # No mask when every row needs every token (known on the host, no sync); an all-True mask would
            # mean the same, so a conservative bound only costs the mask.
            all_needed = draft.lengths is None and ctx.min_remaining is not None and \
                ctx.min_remaining > (tokens.shape[1] - 1 if draft.tree is None else draft.tree.max_depth)
            token_mask = None if all_needed else needed
            positions = ctx.positions[:, None] + offsets.minimum(ctx.remaining[:, None] - 1)
            hidden = bool(getattr(self.drafter, "needs_hidden", False))
            if draft.tree is None:
                out = self.target.forward(state, tokens, positions, token_mask=token_mask, output_hidden=hidden)
            else:
                nodes = torch.arange(draft.tree.num_nodes + 1)
                out = self.target.forward(state, tokens, positions, token_mask=token_mask, tree=draft.tree,
                                          tree_nodes=nodes, output_hidden=hidden)
            stats.count_target_forward(tokens.shape[1])
            return self.logits.probs(out.logits), out

    def _keep(self, state, draft: Draft, acc) -> None:
        """Resolve the verify pass's tree, if it fed one: keep the accepted path (a subclass whose verify pass
        carries more than the draft, e.g. `ptp`'s registers, resolves its own tree here)."""
        if draft.tree is not None:
            self.target.keep(state, acc.path_nodes)

    def _write(self, out, produced, rows, acc, max_new_tokens) -> torch.Tensor:
        """Copy committed tokens into `out`, stopping at EOS or the length limit; returns finished [B_active].
        Tensor ops only: no per-row Python and no host sync."""
        width = acc.tokens.shape[1]
        columns = torch.arange(width, device=out.device)
        count = acc.num_accepted + 1  # >= 1: an active row always commits a token
        if self.eos_token_id is not None:
            is_eos = (acc.tokens == self.eos_token_id) & (columns[None] < count[:, None])
            first_eos = torch.where(is_eos, columns[None], width).amin(1)
            count = torch.where(first_eos < width, first_eos + 1, count)
        start = produced[rows]
        count = count.minimum(max_new_tokens - start)  # >= 1: an active row has room left
        # Columns past a row's count rewrite its last committed token in place, so every index written
        # carries one value and the scatter needs no mask.
        last = (count - 1)[:, None]
        column = torch.where(columns[None] < count[:, None], columns[None], last)
        out.index_put_((rows[:, None].expand(-1, width), start[:, None] + column), acc.tokens.gather(1, column))
        produced[rows] = start + count
        finished = produced[rows] >= max_new_tokens
        if self.eos_token_id is not None:
            finished |= first_eos < count
        return finished
