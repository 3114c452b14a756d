"""Verified next-set decoding: ZipAR's parallel rows as drafts that the AR distribution must accept.

ZipAR samples a row's tokens before the row above is finished, from
distributions that miss the right part of the row above. Here those tokens are
drafts, not output. Every forward does two things at once:

- **Verify at the frontier.** Tokens are final ("settled") in raster order. The
  drafts that directly follow the settled prefix are fed as one chain with the
  full context and tested by the core's acceptance rule against the
  distribution each was drawn from (greedy match or speculative sampling). The
  first rejection is replaced by the rule's correction token; after it the
  frontier falls back to plain AR until it reaches more drafts.
- **Draft ahead.** Every row below the frontier that ZipAR's schedule allows
  (the row above has `window` more tokens, settled or drafted) samples its next
  draft, exactly as in lossy ZipAR.

A draft's key/value was computed with partial context, so before a draft is
verified its stale entry is released and it is fed again; only settled tokens
keep entries the frontier attends to. The output law is therefore exactly
plain AR's (greedy: identical tokens), whatever the drafts were. Each row of a
batch has its own frontier; rows leave the batch when they are done.
"""

from __future__ import annotations

import time

import torch

from mmspec.common.decoder import GenerationOutput, begin_generation
from mmspec.common.kernels import greedy_accept, sample_inverse_cdf, speculative_accept
from mmspec.common.logits import LogitsPipeline, draw_uniform
from mmspec.common.model import ARModel

EMPTY, DRAFT, SETTLED = 0, 1, 2


class _Feed:
    """One row's inputs for a forward: parallel lists, plus what to sample and release."""

    def __init__(self):
        self.index, self.token, self.query_only = [], [], []
        self.samples = []  # (input slot, generated index) of new drafts
        self.stale = []  # generated indices whose old key/value must go before this forward

    def add(self, index: int, token: int, query_only: bool = False) -> int:
        self.index.append(index)
        self.token.append(token)
        self.query_only.append(query_only)
        return len(self.index) - 1


class VerifiedNextSetDecoder:
    def __init__(self, target: ARModel, height: int, width: int, window: int, logits: LogitsPipeline | None = None,
                 pad_token_id: int = -1):
        self.target = target
        self.height, self.width, self.window = height, width, window
        self.logits = logits or LogitsPipeline()
        self.pad_token_id = pad_token_id

    # --- bookkeeping over one row's canvas (all host-side ints) -------------
    def _row_prefix(self, status: list[int], r: int) -> int:
        """Non-empty tokens at the start of grid row r (drafts and settled tokens form a prefix)."""
        start, n = r * self.width, 0
        while n < self.width and status[start + n] != EMPTY:
            n += 1
        return n

    def _plan(self, b: int, status, tokens, has_kv, settled: int, last_prompt: int) -> tuple[_Feed, int]:
        """Inputs of row b: the verify chain first (its first input is the newest settled token), then the
        draft-ahead inputs. Returns the feed and the chain length k."""
        n, width = self.height * self.width, self.width
        feed = _Feed()
        feed.add(settled - 1, last_prompt if settled == 0 else tokens[settled - 1])
        k = 0
        while settled + k < n and status[settled + k] == DRAFT:
            if has_kv[settled + k]:
                feed.stale.append(settled + k)
            feed.add(settled + k, tokens[settled + k])
            k += 1
        chain_row = (settled + k) // width
        for r in range(chain_row + 1, self.height):
            above = self._row_prefix(status, r - 1)
            done = self._row_prefix(status, r)
            start = r * width
            # Drafts without a key/value (new, or released after a rejection) are fed so rows below see them.
            fed_real = set()
            for c in range(done):
                if not has_kv[start + c] and status[start + c] == DRAFT:
                    feed.add(start + c, tokens[start + c])
                    fed_real.add(start + c)
            if done == width or above < min(done + self.window, width):
                continue
            index = start + done
            previous = index - 1
            if previous in fed_real:
                slot = feed.index.index(previous)
            elif status[previous] != EMPTY:  # already in the cache: ask again without a second entry
                slot = feed.add(previous, tokens[previous], query_only=True)
            else:  # the end of the row above does not exist yet: its newest token stands in
                slot = feed.add(previous, tokens[(r - 1) * width + above - 1], query_only=True)
            feed.samples.append((slot, index))
        return feed, k

    def _accept_chains(self, rows, plans, tokens, draft_probs, settled, probs, uniforms):
        """All rows' verify chains in one kernel launch: chains are ragged, so each row passes its length."""
        lengths = [k for _, k in plans]
        longest = max(lengths)
        device = probs.device
        drafts = torch.zeros(len(rows), longest, dtype=torch.long)
        chain_q = torch.zeros(len(rows), longest, probs.shape[-1], device=device)
        for i, (b, k) in enumerate(zip(rows, lengths)):
            s = settled[b]
            drafts[i, :k] = torch.tensor(tokens[b][s:s + k], dtype=torch.long)
            chain_q[i, :k] = draft_probs[b, s:s + k]
        drafts, lengths = drafts.to(device), torch.tensor(lengths, dtype=torch.long, device=device)
        chain_p = probs[:, :longest + 1]  # the chain is each row's first inputs
        if self.logits.greedy:
            return greedy_accept(drafts, chain_p.argmax(-1), lengths)
        return speculative_accept(drafts, chain_q, chain_p, uniforms[:, :longest],
                                  uniforms[:, self.height * self.width], lengths)

    # --- decoding ------------------------------------------------------------
    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int, generator=None, prefill_input: tuple | None = None,
                 callback=None) -> GenerationOutput:
        n = self.height * self.width
        if max_new_tokens != n:
            raise ValueError(f"max_new_tokens ({max_new_tokens}) must equal the {self.height}×{self.width} grid")
        begun = begin_generation(self.target, input_ids, attention_mask, prefill_input, generator,
                                 max_new_tokens=max_new_tokens)
        ids, mask, state, generator, stats, start_time = (begun.ids, begun.mask, begun.state, begun.generator,
                                                          begun.stats, begun.start_time)
        batch, device = ids.shape[0], self.target.device

        vocab = self.target.vocab_size
        first_position = mask.sum(1).tolist()  # position of generated token 0, per row
        last_prompt = ids[:, -1].tolist()
        tokens = [[-1] * n for _ in range(batch)]
        status = [[EMPTY] * n for _ in range(batch)]
        has_kv = [[False] * n for _ in range(batch)]
        draft_probs = torch.zeros(batch, n, vocab, device=device)
        settled = [0] * batch
        rows = list(range(batch))  # original row of each active row
        out = torch.full((batch, n), self.pad_token_id, dtype=torch.long, device=device)
        step = 0
        while rows:
            plans = [self._plan(b, status[b], tokens[b], has_kv[b], settled[b], last_prompt[b]) for b in rows]
            width_in = max(len(f.index) for f, _ in plans)
            tok = torch.zeros(len(rows), width_in, dtype=torch.long)
            pos = torch.zeros(len(rows), width_in, dtype=torch.long)
            live = torch.zeros(len(rows), width_in, dtype=torch.bool)
            query = torch.zeros(len(rows), width_in, dtype=torch.bool)
            stale = torch.full((len(rows), max(1, max(len(f.stale) for f, _ in plans))), -1, dtype=torch.long)
            for i, (b, (feed, _)) in enumerate(zip(rows, plans)):
                m = len(feed.index)
                tok[i, :m] = torch.tensor(feed.token)
                pos[i, :m] = torch.tensor(feed.index) + first_position[b]
                pos[i, m:] = pos[i, m - 1]
                live[i, :m] = True
                query[i, :m] = torch.tensor(feed.query_only)
                if feed.stale:
                    stale[i, :len(feed.stale)] = torch.tensor(feed.stale) + first_position[b]
                for index in feed.stale:
                    has_kv[b][index] = False
            if bool((stale >= 0).any()):
                self.target.release(state, stale.to(device))
            with stats.timer("verify", device):
                logits = self.target.forward(state, tok.to(device), pos.to(device), token_mask=live.to(device),
                                             query_only=query.to(device)).logits
                stats.count_target_forward(width_in)
            with stats.timer("accept", device):
                probs = self.logits.probs(logits)  # [B, L, V]
                uniforms = draw_uniform(generator, len(rows), n + 1 + self.height, device)
                num, accepted = self._accept_chains(rows, plans, tokens, draft_probs, settled, probs, uniforms)
                committed, release = [], torch.full((len(rows), n), -1, dtype=torch.long)
                for i, (b, (feed, k)) in enumerate(zip(rows, plans)):
                    s = settled[b]
                    m = int(num[i])
                    for j, index in enumerate(feed.index):
                        if index >= 0 and not feed.query_only[j]:
                            has_kv[b][index] = True
                    for j in range(m + 1):
                        tokens[b][s + j] = int(accepted[i, j])
                        status[b][s + j] = SETTLED
                    has_kv[b][s + m] = False  # the correction / bonus token is fed next step
                    # Drafts after the rejection were fed with a rejected token on their left: their
                    # entries go; the drafts stay and are verified again later.
                    for j in range(m, k):
                        release[i, j - m] = s + j + first_position[b]
                        has_kv[b][s + j] = False
                    settled[b] = s + m + 1
                    committed.append(m + 1)
                    for j, (slot, index) in enumerate(feed.samples):
                        p = probs[i, slot]
                        tokens[b][index] = int(p.argmax() if self.logits.greedy
                                               else sample_inverse_cdf(p, uniforms[i, n + 1 + j]))
                        status[b][index] = DRAFT
                        draft_probs[b, index] = p
                if bool((release >= 0).any()):
                    self.target.release(state, release.to(device))
            stats.record_step(torch.tensor(committed), max(k for _, k in plans))
            if callback is not None:
                callback(step, {"rows": torch.tensor(rows), "tokens": None,
                                "num_accepted": torch.tensor(committed) - 1})
            step += 1
            done = [i for i, b in enumerate(rows) if settled[b] >= n]
            if done:
                for i in done:
                    out[rows[i]] = torch.tensor(tokens[rows[i]], device=device)
                keep = [i for i in range(len(rows)) if i not in done]
                rows = [rows[i] for i in keep]
                if rows:
                    self.target.select_rows(state, torch.tensor(keep, device=device))
                    if isinstance(generator, list):
                        generator = [generator[i] for i in keep]
        stats.tokens = batch * n
        stats.time_total_s = time.perf_counter() - start_time
        return GenerationOutput(sequences=out, lengths=torch.full((batch,), n, dtype=torch.long, device=device),
                                stats=stats)
