"""`eagle`, `lantern`, `lantern++`: an EAGLE drafter with strict or latent-relaxed acceptance.

LANTERN (ICLR 2025, arXiv:2410.03355) and LANTERN++ (arXiv:2502.06352). Image tokens whose VQ
latents are close are interchangeable, so a draft x is tested against a relaxed target p^x: the target
probability of x's nearest latent neighbours n_1, n_2, … (nearest first, among its k nearest) is moved onto
x as long as the pooled mass c_J = p(n_1) + … + p(n_J) stays within the bound:

- `lantern`: c_J ≤ δ, so TV(p^x, p) = c_J ≤ δ;
- `lantern++`: c_J ≤ (λ − 1)·p(x), so p^x(x) ≤ λ·p(x) (no large boost for a token the target doubts).

A chain draft x with draft probability q(x) is kept with probability min(1, p^x(x)/q(x)); at the first
rejection the extra token is drawn from norm(max(p^x − q, 0)), the residual of the same relaxed target, so
the token emitted at that step follows p^x exactly when q is one-hot. That residual zeroes only the J
neighbours whose mass was moved onto x; the public code zeroes x's k + 1 nearest neighbours whenever any
was used, removing mass that was never pooled and pushing the output further from p than δ (the quirk the
spec notes; not kept). Static trees (LANTERN++'s drafting, and `eagle`'s option) try the children of a node
in rank order against the relaxed residual (`tree_accept` with a relaxation). Greedy decoding keeps x when
p^x(x) reaches the target's maximum. δ = 0 (or λ = 1) is `eagle` exactly.

`eagle` is the strict, lossless baseline: the same drafter with speculative sampling (chains) or
multi-candidate rejection (trees); greedy output identical to plain AR.
"""

from __future__ import annotations


import torch

from mmspec.common.accept import Acceptance, AcceptRule, GreedyMatch, SpeculativeSampling, tree_accept
from mmspec.common.dynamic_tree import dynamic_tree_settings
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.heads import load_head
from mmspec.common.kernels import assemble_tokens, sample_extra_token
from mmspec.common.logits import draw_uniform
from mmspec.common.plugin import Plugin
from mmspec.common.registry import register_plugin
from mmspec.common.structure import CodeGrid
from mmspec.common.tree import parse_branching

from .config import EagleConfig, LanternConfig, LanternPPConfig
from .drafter import BUNDLED_EAGLE_HEAD, BoundHead, EagleDrafter, EagleHead, load_bundled_head
from .kernels import codebook_neighbours, pooled_probability

__all__ = ["RelaxedAcceptance", "EagleHead", "EagleDrafter", "BoundHead", "codebook_neighbours",
           "pooled_probability", "load_bundled_head", "BUNDLED_EAGLE_HEAD"]


class RelaxedAcceptance(AcceptRule):
    """LANTERN (give `delta`) or LANTERN++ (give `lam`) acceptance, for chain and static-tree drafts.

    neighbours: [V, k] from `codebook_neighbours`. greedy: temperature-0 decoding. record: keep, for every
    tested draft, what the test used (`self.records`: dicts of tokens, target rows, relaxed probability, J,
    accepted), for tests that check the bound.
    """

    lossless = False
    needs_draft_probs = True

    def __init__(self, neighbours: torch.Tensor, *, delta: float | None = None, lam: float | None = None,
                 greedy: bool = False, record: bool = False):
        if (delta is None) == (lam is None):
            raise ValueError("give exactly one of delta (LANTERN) and lam (LANTERN++)")
        if delta is not None and (isinstance(delta, bool) or not isinstance(delta, (int, float))
                                  or not 0 <= delta <= 1):
            raise ValueError(f"delta must be a number in [0, 1], got {delta!r}")
        if lam is not None and (isinstance(lam, bool) or not isinstance(lam, (int, float)) or not lam >= 1):
            raise ValueError(f"lam (lambda) must be a number >= 1, got {lam!r}")
        if neighbours.dim() != 2 or neighbours.shape[1] < 1:
            raise ValueError(f"neighbours must be [V, k] with k >= 1, got {tuple(neighbours.shape)}")
        self.name = "lantern" if delta is not None else "lantern++"
        self.neighbours = neighbours.long()
        self.delta, self.lam, self.greedy = delta, lam, greedy
        self.records: list[dict] | None = [] if record else None

    def _pool(self, tokens: torch.Tensor, probs: torch.Tensor):
        """Relaxed probabilities [N] and the merged neighbours [N, k] (-1 past J) of draft tokens under probs."""
        neighbours = self.neighbours.to(probs.device)
        pooled, count = pooled_probability(tokens, neighbours, probs, delta=self.delta, lam=self.lam)
        used = torch.arange(neighbours.shape[1], device=probs.device)[None] < count[:, None]
        merged = torch.where(used, neighbours[tokens], -1)
        return pooled, count, merged

    def _check_vocab(self, vocab: int) -> None:
        if self.neighbours.shape[0] != vocab:
            raise ValueError(f"the neighbour table covers {self.neighbours.shape[0]} codes, the target has {vocab}")

    def __call__(self, draft, target_probs, generator=None) -> Acceptance:
        self._check_vocab(target_probs.shape[-1])
        if draft.tree is not None:
            return self._tree(draft, target_probs, generator)
        batch, k = draft.tokens.shape
        vocab, device = target_probs.shape[-1], target_probs.device
        rows = torch.arange(batch, device=device)
        p = target_probs[:, :k].reshape(batch * k, vocab)
        x = draft.tokens.reshape(-1)
        pooled, count, merged = self._pool(x, p)
        p_x = p.gather(1, x[:, None]).squeeze(1)
        uniforms = None if self.greedy else draw_uniform(generator, batch, k + 1, device)
        if self.greedy:
            accept = (pooled >= p.amax(-1)) & (p_x > 0)
        else:
            q_x = (torch.ones_like(p_x) if draft.probs is None
                   else draft.probs.reshape(batch * k, vocab).gather(1, x[:, None]).squeeze(1))
            # A token the processed target forbids (p(x) = 0, e.g. outside top-k) is never accepted.
            accept = (uniforms[:, :k].reshape(-1) * q_x <= pooled) & (p_x > 0)
        accept = accept.view(batch, k)
        num = accept.long().cumprod(1).sum(1)
        if self.records is not None:
            tested = (torch.arange(k, device=device)[None] <= num[:, None]).reshape(-1)
            self.records.append({"tokens": x[tested], "target": p[tested], "pooled": pooled[tested],
                                 "count": count[tested], "accepted": accept.reshape(-1)[tested]})

        if self.greedy:
            extra = target_probs[rows, num].argmax(-1)
        else:
            # The rejected draft was tested against its relaxed target p^x: the residual comes from that.
            at = rows * k + num.clamp(max=k - 1)
            relaxed = target_probs[rows, num]  # [B, V]
            drop = merged[at] >= 0  # the merged neighbours leave (a product, not a boolean index: no host read)
            keep = torch.ones_like(relaxed).scatter_reduce(1, merged[at].clamp(min=0), (~drop).to(relaxed.dtype),
                                                           reduce="prod")
            relaxed = relaxed * keep
            relaxed[rows, x[at]] = pooled[at]
            q = None if draft.probs is None else draft.probs.to(relaxed.dtype)
            extra = sample_extra_token(target_probs, draft.tokens, q, num, uniforms[:, k], tested_probs=relaxed)
        return Acceptance(num, assemble_tokens(draft.tokens, num, extra))

    def _tree(self, draft, target_probs, generator) -> Acceptance:
        def relax(probs, tokens):
            pooled, count, merged = self._pool(tokens, probs)
            if self.records is not None:
                self.records.append({"tokens": tokens, "target": probs, "pooled": pooled, "count": count,
                                     "accepted": None})
            return pooled, merged

        batch, n = draft.tokens.shape
        uniforms = None if self.greedy else draw_uniform(generator, batch, n + 2, target_probs.device)
        return tree_accept(draft, target_probs, uniforms, greedy=self.greedy, relax=relax)


class _EaglePlugin(Plugin):
    modality = "vision"
    requires = CodeGrid
    head_trainer = "mmspec.plugins.lantern.train:train_eagle_head"
    bench_default_variants = ({"batch_size": 1}, {"batch_size": 4})
    # Sampled static trees draw each node's first child from the head (see EagleDrafter); LANTERN's relaxed test
    # takes deterministic children only.
    sampled_tree_children = False

    def __init__(self, **config):
        super().__init__(**config)
        name = type(self.config).__name__
        self.tree = parse_branching(self.config.tree_branching, f"{name}.tree_branching")
        self.dynamic = dynamic_tree_settings(self.config, self.tree, name)
        self._head: EagleHead | None = None
        self._neighbours: dict[tuple, torch.Tensor] = {}

    def head_module(self) -> EagleHead:
        if self._head is None:
            self._head = load_head(EagleHead, self.config.head_path or BUNDLED_EAGLE_HEAD,
                                   f"{type(self.config).__name__}.head_path")
        return self._head

    def head(self, target) -> EagleHead:
        return self.head_module().to(target.device)

    def check_pipeline(self, pipeline) -> None:
        """Also: the head must draft over this pipeline's codebook (fail at load time, not mid-generation)."""
        super().check_pipeline(pipeline)
        latents = pipeline.token_structure.latents
        vocab = self.head_module().config.vocab_size
        if latents is not None and latents.shape[0] != vocab:
            where = self.config.head_path or "the bundled head (trained on llamagen-tiny)"
            raise ValueError(f"plugin {self.name!r}: {where} drafts over {vocab} codes, this pipeline's codebook has "
                             f"{latents.shape[0]}; train a head for it (`mmspec train-head {self.name} --model ... --out DIR`) "
                             "and pass head_path=DIR")

    def _rule(self, grid, target, logits) -> AcceptRule:
        return GreedyMatch() if logits.greedy else SpeculativeSampling()

    def neighbours(self, grid: CodeGrid, target) -> torch.Tensor:
        k, codes = self.config.k, grid.latents
        if codes is None:
            raise ValueError(f"plugin {self.name!r} compares codes by their VQ latents; this pipeline's "
                             "CodeGrid carries no latents (codebook)")
        key = (k, codes.data_ptr(), tuple(codes.shape))
        if key not in self._neighbours:
            if codes.shape[0] != target.vocab_size:
                raise ValueError(f"the codebook has {codes.shape[0]} codes, the target's vocabulary "
                                 f"{target.vocab_size}")
            if k > codes.shape[0] - 1:
                raise ValueError(f"{type(self.config).__name__}.k must be at most the codebook size - 1 "
                                 f"({codes.shape[0] - 1}), got {k}")
            self._neighbours[key] = codebook_neighbours(codes, k).to(target.device)
        return self._neighbours[key]

    def build_decoder(self, pipeline, request):
        target, logits = request.target, request.logits
        rule = self._rule(request.structure, target, logits)
        drafter = EagleDrafter(self.head(target), target, tree=self.tree, dynamic=self.dynamic,
                               sampled_children=self.sampled_tree_children)
        chain = self.tree is None and self.dynamic is None
        return SpeculativeDecoder(target, drafter, rule, logits,
                                  num_draft_tokens=self.config.num_draft_tokens if chain else 0,
                                  eos_token_id=request.eos_token_id, pad_token_id=request.pad_token_id)

    def advice_when_nothing_saved(self, call: dict) -> list[str]:
        hints = super().advice_when_nothing_saved(call)
        if self.tree is not None or self.dynamic is not None:
            hints.insert(-1, "draft a chain instead of a tree (--set tree_branching= --set num_draft_tokens=2): "
                             "a tree's nodes widen every verify pass, which pays only when some are accepted")
        return hints

    def save_pretrained(self, directory):
        """The head this plugin drafts with, under `eagle_head/` (bundled or not: the folder stands alone)."""
        self.head_module().save_pretrained(directory / "eagle_head")
        return {"head_path": "eagle_head"}


def _sweep(*settings: dict) -> tuple:
    """Bench rows with other settings, at batch 4 on 40 images (CPU time); the default rows give batch-1
    latency and the 100-image quality."""
    return tuple({"batch_size": 4, "num_samples": 40, "settings": s} for s in settings)


@register_plugin("eagle")
class EaglePlugin(_EaglePlugin):
    lossless = True
    paper = "Li et al. 2024, EAGLE (arXiv:2401.15077), the drafter of LANTERN (arXiv:2410.03355)"
    Config = EagleConfig
    sampled_tree_children = True
    # The last two rows: what `mmspec plan-tree eagle` chose on the 2-core CPU the rows were measured on.
    bench_variants = _sweep({"tree_branching": "4,2,1,1"}, {"temperature": 0.0}) + (
        {"batch_size": 1, "num_samples": 40, "settings": {"tree_branching": "4,2,1,1"}},
        {"batch_size": 1, "settings": {"num_draft_tokens": 2}}, {"batch_size": 4, "settings": {"num_draft_tokens": 2}})


@register_plugin("lantern")
class LanternPlugin(_EaglePlugin):
    lossless = False
    paper = "LANTERN, relaxed speculative decoding for image AR models (ICLR 2025, arXiv:2410.03355)"
    Config = LanternConfig
    bench_variants = _sweep(*({"k": k, "delta": d} for k, d in ((8, 0.1), (128, 0.1), (32, 0.2), (32, 0.4))))

    def _rule(self, grid, target, logits):
        return RelaxedAcceptance(self.neighbours(grid, target), delta=self.config.delta, greedy=logits.greedy)


@register_plugin("lantern++")
class LanternPPPlugin(_EaglePlugin):
    lossless = False
    paper = "LANTERN++, static-tree drafting with a multiplicative relaxation (arXiv:2502.06352)"
    Config = LanternPPConfig
    # The last row: the tree `mmspec plan-tree lantern++` chose on the 2-core CPU the rows were measured on.
    bench_variants = _sweep(*({"k": k, "lam": lam} for k, lam in ((5, 10.0), (32, 5.0)))) + (
        {"batch_size": 1, "settings": {"tree_branching": "0;0.0"}},)

    def __init__(self, **config):
        super().__init__(**config)
        if self.tree is None and self.dynamic is None:
            raise ValueError("LanternPPConfig.tree_branching must describe a static tree, e.g. '4,2,1,1' "
                             "(LANTERN++ drafts trees; or tree_branching='' with tree_depth > 0 for a dynamic one)")

    def _rule(self, grid, target, logits):
        return RelaxedAcceptance(self.neighbours(grid, target), lam=self.config.lam, greedy=logits.greedy)
