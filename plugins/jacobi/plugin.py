"""The training-free Jacobi family: `sjd`, `mc_sjd` and `gsd`.

- `sjd` — Speculative Jacobi Decoding (Teng et al., ICLR 2025, arXiv:2410.01699): the target refines a
  window of its own guesses; each guess is tested against the distribution it was drawn from
  (speculative sampling), with residual resampling at the first rejection. Lossless.
- `mc_sjd` — MC-SJD / Speculative Coupled Decoding (So et al., arXiv:2510.24211): the same, but every
  window position's new draft is coupled with its previous one (maximal coupling, or Gumbel noise fixed
  per position), so drafts stop changing once the context around them settles. Lossless.
- `gsd` — Grouped Speculative Decoding (So et al., ICCV 2025, arXiv:2508.07747): SJD whose test pools
  the probability of a dynamic group of tokens close to the draft (in target-probability rank, in
  probability and in input embedding). Lossy: the speed/quality trade-off is in BENCHMARKS.md.

All three keep a separate window and accepted length per row (the public code commits the batch minimum)
and run with CFG through the core's `CFGModel`. Greedy decoding (temperature 0) turns each into plain
Jacobi decoding with greedy matching, identical to AR.
"""

from __future__ import annotations

import math

import torch

from mmspec.common.accept import Acceptance, AcceptRule, GreedyMatch, SpeculativeSampling
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.kernels import assemble_tokens, sample_extra_token
from mmspec.common.logits import draw_uniform
from mmspec.common.plugin import Plugin
from mmspec.common.registry import register_plugin
from mmspec.common.structure import CodeGrid

from .config import GSDConfig, MCSJDConfig, SJDConfig
from .drafter import COUPLINGS, INITS, JacobiDrafter
from .kernels import group_sums, rank_window

__all__ = ["GroupedAcceptance", "JacobiDrafter", "INITS", "COUPLINGS"]


class GroupedAcceptance(AcceptRule):
    """GSD's test: accept draft x if U < min(1, Σ_{y∈G(x)} p(y) / Σ_{y∈G(x)} q(y)).

    G(x) = x and the tokens ranked within `group_size` of x in the target distribution whose probability
    is within `prob_gap` of p(x) and whose input embedding is within `dist_threshold` (squared L2) of x's.
    On rejection the extra token is drawn from norm(max(p − q, 0)), as in GSD (not group-aware). A token
    the processed target forbids (p(x) = 0, e.g. outside top-k) is never accepted, whatever its group.
    With group_size = 0 this is exactly speculative sampling (SJD).
    """

    name = "grouped"
    lossless = False
    needs_draft_probs = True

    def __init__(self, embeddings: torch.Tensor, group_size: int, prob_gap: float, dist_threshold: float):
        self.embeddings = embeddings.detach().float()
        self.group_size = group_size
        self.prob_gap = prob_gap
        self.dist_threshold = dist_threshold

    def __call__(self, draft, target_probs, generator=None) -> Acceptance:
        batch, k = draft.tokens.shape
        vocab, device = target_probs.shape[-1], target_probs.device
        uniforms = draw_uniform(generator, batch, k + 1, device)
        p = target_probs[:, :k].reshape(batch * k, vocab)
        q = draft.probs.reshape(batch * k, vocab)
        x = draft.tokens.reshape(-1)
        candidates = rank_window(p, x, self.group_size)
        pooled_p, pooled_q = group_sums(x, candidates, p, q, self.embeddings.to(device), self.prob_gap,
                                        self.dist_threshold)
        allowed = p.gather(1, x[:, None]).squeeze(1) > 0
        accept = ((uniforms[:, :k].reshape(-1) * pooled_q <= pooled_p) & allowed).view(batch, k)
        num = accept.long().cumprod(1).sum(1)
        extra = sample_extra_token(target_probs, draft.tokens, draft.probs, num, uniforms[:, k])
        return Acceptance(num, assemble_tokens(draft.tokens, num, extra))


def median_squared_distance(embeddings: torch.Tensor, max_points: int = 1024) -> float:
    """Median squared L2 distance between distinct embedding rows (a fixed subset for large vocabularies)."""
    e = embeddings.detach().float()
    if e.shape[0] > max_points:
        e = e[torch.randperm(e.shape[0], generator=torch.Generator().manual_seed(0))[:max_points]]
    d = torch.cdist(e, e).pow(2)
    off_diagonal = d[~torch.eye(len(e), dtype=torch.bool, device=d.device)]
    return float(off_diagonal.median()) if off_diagonal.numel() else 1.0


def sweep_rows(**values) -> tuple:
    """Bench rows varying one setting at a time. Sweeps compare settings with each other, so they run at
    batch 4 on 40 images (CPU time); the default rows give batch-1 latency and the 100-image quality."""
    return tuple({"batch_size": 4, "num_samples": 40, "settings": {key: v}}
                 for key, options in values.items() for v in options)


class _JacobiPlugin(Plugin):
    modality = "vision"
    requires = CodeGrid
    coupling = "independent"
    bench_default_variants = ({"batch_size": 1}, {"batch_size": 4})

    def _drafter(self, target, grid: CodeGrid) -> JacobiDrafter:
        return JacobiDrafter(target.vocab_size, self.config.window, init=self.config.init,
                             coupling=getattr(self.config, "coupling", self.coupling), grid_width=grid.cols)

    def _rule(self, target, logits) -> AcceptRule:
        return GreedyMatch() if logits.greedy else SpeculativeSampling()

    def build_decoder(self, pipeline, request):
        target, logits = request.target, request.logits
        drafter = self._drafter(target, request.structure)
        return SpeculativeDecoder(target, drafter, self._rule(target, logits), logits,
                                  num_draft_tokens=self.config.window, eos_token_id=request.eos_token_id,
                                  pad_token_id=request.pad_token_id)


@register_plugin("sjd")
class SJDPlugin(_JacobiPlugin):
    lossless = True
    paper = "Teng et al. 2025, Speculative Jacobi Decoding (arXiv:2410.01699)"
    Config = SJDConfig
    bench_variants = sweep_rows(window=(4, 8, 32), init=[i for i in INITS if i != "random"])


@register_plugin("mc_sjd")
class MCSJDPlugin(_JacobiPlugin):
    lossless = True
    paper = "So et al. 2025, MC-SJD / Speculative Coupled Decoding (arXiv:2510.24211)"
    Config = MCSJDConfig
    bench_variants = ({"batch_size": 1, "settings": {"coupling": "gumbel"}},) + sweep_rows(
        window=(8, 32), init=("vertical",))


@register_plugin("gsd")
class GSDPlugin(_JacobiPlugin):
    lossless = False
    paper = "So et al. 2025, Grouped Speculative Decoding (ICCV 2025, arXiv:2508.07747)"
    Config = GSDConfig
    bench_variants = sweep_rows(group_size=(2, 12), prob_gap=(0.05,), embed_threshold=(0.5, math.inf))

    def _rule(self, target, logits):
        if logits.greedy:  # a one-hot target leaves no group to pool: greedy Jacobi decoding
            return GreedyMatch()
        embeddings = target.token_embeddings()
        threshold = self.config.embed_threshold * median_squared_distance(embeddings)
        return GroupedAcceptance(embeddings, self.config.group_size, self.config.prob_gap, threshold)
