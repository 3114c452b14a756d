"""The Jacobi drafter: a window of draft tokens refined by the target's own verify passes.

No draft model. Each step the decoder verifies [last, d_1 … d_K] in one target
forward; output j is the target's distribution for window position j given the
window tokens before it. After the acceptance rule keeps m drafts plus one
token, the next window is built from that same pass:

- positions after the kept prefix that already have a distribution (old window
  positions m+2 … K, and one past the old window) get a new draft from it —
  `independent`: a fresh sample (SJD); `maximal`: coupled with that position's
  previous draft, so it stays unchanged with probability 1 − TV(p_t, p_{t−1})
  (MC-SJD); `gumbel`: argmax(log p + g) with Gumbel noise g fixed per absolute
  position, so a draft changes only where p does (MC-SJD's Gumbel variant);
- the m positions entering at the tail are initialised (`INITS`).

Each draft records the distribution it was drawn from (the `probs` of the
`Draft`), so the next verify pass can run the speculative-sampling test
min(1, p_t(x)/q(x)) against it. That is what makes SJD and MC-SJD lossless: a
draft is a sample from a known q, independent of the acceptance uniforms.

Every row keeps its own window and accepted length (no lockstep), and draws a
fixed number of uniforms per step from its own generator, so its output does not
depend on the rest of the batch.
"""

from __future__ import annotations

import torch

from mmspec.common.accept import Acceptance, Draft
from mmspec.common.draft import Drafter, StepContext
from mmspec.common.kernels import sample_inverse_cdf
from mmspec.common.logits import draw_uniform

from .config import COUPLINGS, INITS  # noqa: F401  (COUPLINGS re-exported)
from .kernels import maximal_coupling


class JacobiDrafter(Drafter):
    """window: K draft tokens per step. init: how tokens entering the window are drafted —

    - `random`: uniform over the vocabulary, recorded with its true q = 1/V (the public SJD code records a
      one-hot q; both are lossless, but 1/V accepts with probability 1 − TV(p, uniform) instead of p(x));
    - `repeat_horizon`: the token to its left (deterministic, one-hot q);
    - `sample_horizon`: a sample from the newest distribution the verify pass produced (the one past the
      old window), recorded with that distribution; `random` for the very first window;
    - `vertical`: the token one image row above (grid_width positions back), else `repeat_horizon`.
    A token that cannot be copied (a prompt token outside the vocabulary) falls back to `random`.
    """

    def __init__(self, vocab_size: int, window: int, init: str = "random", coupling: str = "independent",
                 grid_width: int | None = None):
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        if init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}; got {init!r}")
        if coupling not in COUPLINGS:
            raise ValueError(f"coupling must be one of {', '.join(COUPLINGS)}; got {coupling!r}")
        if init == "vertical" and (grid_width is None or grid_width < 1):
            raise ValueError("init='vertical' needs tokens that form a 2-D grid (grid_width); this pipeline "
                             "has none — use 'random', 'repeat_horizon' or 'sample_horizon'")
        self.vocab_size = vocab_size
        self.window = window
        self.init = init
        self.coupling = coupling
        self.grid_width = grid_width
        self.drafts: torch.Tensor | None = None  # [B, K] tokens at positions pos+1 … pos+K
        self.draft_probs: torch.Tensor | None = None  # [B, K, V] the distribution each was drawn from
        self.history: torch.Tensor | None = None  # [B, cap] generated tokens (for `vertical`)
        self.history_len: torch.Tensor | None = None  # [B] tokens generated so far
        self.noise: torch.Tensor | None = None  # [B, K+1, V] Gumbel noise of positions pos+1 … pos+K+1

    # --- protocol ----------------------------------------------------------
    def begin(self, input_ids, attention_mask):
        self.drafts = self.draft_probs = self.history = self.history_len = self.noise = None

    def propose(self, ctx: StepContext) -> Draft:
        if self.drafts is None:
            self._first_window(ctx)
        probs = None if ctx.logits.greedy else self.draft_probs
        return Draft(tokens=self.drafts, probs=probs, forwards=0)

    def commit(self, ctx: StepContext, acceptance: Acceptance, target_probs: torch.Tensor | None = None,
               output=None):
        if target_probs is None:
            raise ValueError("JacobiDrafter.commit needs the verify pass's target_probs")
        batch, k = self.drafts.shape
        vocab = target_probs.shape[-1]
        device = target_probs.device
        num = acceptance.num_accepted
        self._append_history(acceptance.tokens, num + 1)
        # A fixed number of uniforms per row and step: 3 per window slot (draw, keep test, init).
        u = draw_uniform(ctx.generator, batch, 3 * k, device)
        u_draw, u_keep, u_init = u[:, :k], u[:, k:2 * k], u[:, 2 * k:]

        # New slot i sits at old output index i + m + 1 (position pos + 1 + i + m + 1).
        src = torch.arange(k, device=device)[None, :] + num[:, None] + 1  # [B, K]
        has_dist = src <= k
        p_src = target_probs.gather(1, src.clamp(max=k)[..., None].expand(-1, -1, vocab))  # [B, K, V]
        if self.coupling == "gumbel":
            self.noise = self._shift_noise(ctx, num, vocab, device)
            tokens = (p_src.log() + self.noise[:, :k]).argmax(-1)
        else:
            tokens = sample_inverse_cdf(p_src, u_draw)
            if self.coupling == "maximal":
                has_old = src < k
                old = src.clamp(max=k - 1)
                old_tokens = self.drafts.gather(1, old)
                old_probs = self.draft_probs.gather(1, old[..., None].expand(-1, -1, vocab))
                coupled, _ = maximal_coupling(old_tokens.flatten(), old_probs.flatten(0, 1), p_src.flatten(0, 1),
                                              u_keep.flatten(), u_draw.flatten())
                tokens = torch.where(has_old, coupled.view(batch, k), tokens)
        self.drafts, self.draft_probs = tokens, p_src
        newest = target_probs[:, k]  # the distribution one past the old window
        self._fill_tail(ctx, acceptance.next_tokens, ~has_dist, u_init, newest)

    def select_rows(self, rows):
        for name in ("drafts", "draft_probs", "history", "history_len", "noise"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[rows.to(value.device)])

    def admit(self, input_ids, attention_mask, ctx):
        if self.drafts is None:  # nothing proposed yet: the first proposal starts every row's window
            return
        names = ("drafts", "draft_probs", "history", "history_len", "noise")
        running = {name: getattr(self, name) for name in names}
        self._first_window(ctx)  # the new rows' first windows, drawn from their own generators as alone
        for name in names:
            old, new = running[name], getattr(self, name)
            if old is None:
                continue
            if name == "history":
                width = max(old.shape[1], new.shape[1])
                old, new = (torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in (old, new))
            setattr(self, name, torch.cat([old, new.to(old.device)]))

    # --- helpers -----------------------------------------------------------
    def _first_window(self, ctx: StepContext) -> None:
        batch, k, device = ctx.last_tokens.shape[0], self.window, ctx.last_tokens.device
        self.history = torch.zeros(batch, 0, dtype=torch.long, device=device)
        self.history_len = torch.zeros(batch, dtype=torch.long, device=device)
        self.drafts = torch.zeros(batch, k, dtype=torch.long, device=device)
        self.draft_probs = torch.zeros(batch, k, self.vocab_size, device=device)
        if self.coupling == "gumbel":
            self.noise = self._gumbel(ctx.generator, batch, k + 1, device)
        u_init = draw_uniform(ctx.generator, batch, k, device)
        self._fill_tail(ctx, ctx.last_tokens, torch.ones(batch, k, dtype=torch.bool, device=device), u_init, None)

    def _gumbel(self, generator, batch: int, slots: int, device) -> torch.Tensor:
        u = draw_uniform(generator, batch, slots * self.vocab_size, device).view(batch, slots, self.vocab_size)
        return -torch.log(-torch.log(u.clamp(min=1e-20)))

    def _shift_noise(self, ctx, num, vocab, device) -> torch.Tensor:
        """Keep each absolute position's noise: slot i takes old slot i + m + 1, fresh noise fills the tail."""
        batch, slots = self.noise.shape[:2]
        fresh = self._gumbel(ctx.generator, batch, slots, device)
        src = torch.arange(slots, device=device)[None, :] + num[:, None] + 1
        old = self.noise.gather(1, src.clamp(max=slots - 1)[..., None].expand(-1, -1, vocab))
        return torch.where((src < slots)[..., None], old, fresh)

    def _append_history(self, tokens: torch.Tensor, counts: torch.Tensor) -> None:
        need = int((self.history_len + counts).max())
        if need > self.history.shape[1]:
            grow = max(need - self.history.shape[1], 64)
            self.history = torch.cat([self.history, self.history.new_zeros(self.history.shape[0], grow)], 1)
        for j in range(tokens.shape[1]):
            write = j < counts
            idx = (self.history_len + j).clamp(max=self.history.shape[1] - 1)
            current = self.history.gather(1, idx[:, None]).squeeze(1)
            self.history.scatter_(1, idx[:, None], torch.where(write, tokens[:, j], current)[:, None])
        self.history_len = self.history_len + counts

    def _token_at(self, index: torch.Tensor) -> torch.Tensor:
        """Generated token `index` per row ([B] long, index < history_len + K): history or current window."""
        in_history = index < self.history_len
        from_history = self.history.gather(1, index.clamp(0, max(self.history.shape[1] - 1, 0))[:, None])[:, 0] \
            if self.history.shape[1] else torch.zeros_like(index)
        slot = (index - self.history_len).clamp(0, self.window - 1)
        return torch.where(in_history, from_history, self.drafts.gather(1, slot[:, None])[:, 0])

    def _fill_tail(self, ctx, last_tokens, fresh, u_init, newest) -> None:
        """Initialise the slots marked `fresh` ([B, K] bool, a suffix of each row), left to right."""
        batch, k = fresh.shape
        vocab, device = self.vocab_size, fresh.device
        greedy = ctx.logits.greedy
        random_tokens = (u_init * vocab).long().clamp(max=vocab - 1)
        uniform = torch.full((vocab,), 1.0 / vocab, device=device)
        for i in range(k):
            rows = fresh[:, i]
            if not bool(rows.any()):
                continue
            left = last_tokens if i == 0 else self.drafts[:, i - 1]
            probs = uniform.expand(batch, -1)
            tokens = random_tokens[:, i]
            if self.init in ("repeat_horizon", "vertical"):
                source = left
                if self.init == "vertical":
                    index = self.history_len + i - self.grid_width  # generated index of the token above
                    above = self._token_at(index.clamp(min=0))
                    source = torch.where(index >= 0, above, left)
                copyable = (source >= 0) & (source < vocab)
                tokens = torch.where(copyable, source, tokens)
                one_hot = torch.nn.functional.one_hot(source.clamp(0, vocab - 1), vocab).float()
                probs = torch.where(copyable[:, None], one_hot, probs)
            elif self.init == "sample_horizon" and newest is not None:
                tokens = newest.argmax(-1) if greedy else sample_inverse_cdf(newest, u_init[:, i])
                probs = newest
            self.drafts[:, i] = torch.where(rows, tokens, self.drafts[:, i])
            self.draft_probs[:, i] = torch.where(rows[:, None], probs, self.draft_probs[:, i])
