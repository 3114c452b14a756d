"""Drafts, acceptance results and the acceptance rules of the core.

A rule turns a draft and the target's processed distributions into an
`Acceptance`: how many drafts each row keeps, plus one more token (the
correction at the first rejection, or the bonus token when all were kept).
Plugins register their own rules by subclassing `AcceptRule`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import greedy_accept, sample_inverse_cdf, speculative_accept
from .logits import draw_ragged_uniforms, draw_uniform
from .tree import TreeSpec


@dataclass
class Draft:
    tokens: torch.Tensor  # [B, K] long; chain drafts, or tree nodes 1..N in TreeSpec order
    probs: torch.Tensor | None = None  # [B, K, V] processed draft distributions; None for deterministic drafts
    tree: TreeSpec | None = None
    forwards: int = 0  # drafter forward passes spent on this draft
    lengths: torch.Tensor | None = None  # [B] long; chain drafts row b really has (ragged chains), None = K each

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]


@dataclass
class Acceptance:
    num_accepted: torch.Tensor  # [B] long; drafts kept per row (0..K), not counting the extra token
    tokens: torch.Tensor  # [B, K+1] long; kept drafts then the extra token, padded with -1
    path_nodes: torch.Tensor | None = None  # [B, depth+1] long; tree node ids of the kept path incl. root, -1 padded
    max_accepted: int | None = None  # on the host: num_accepted.max(), once the decoder has read it (else None)

    @property
    def next_tokens(self) -> torch.Tensor:
        """[B] the extra token of each row: the next token to feed."""
        return self.tokens.gather(1, self.num_accepted[:, None]).squeeze(1)


class AcceptRule:
    """Base class. `lossless` says whether the output law (or greedy output) equals plain AR's."""

    name = "rule"
    lossless = False
    needs_draft_probs = False

    def __call__(self, draft: Draft, target_probs: torch.Tensor, generator=None) -> Acceptance:
        """target_probs: [B, K+1, V] processed target distributions after the root and each draft."""
        raise NotImplementedError


class GreedyMatch(AcceptRule):
    """Keep drafts while they equal the target's argmax: greedy output identical to plain AR."""

    name = "greedy"
    lossless = True

    def __call__(self, draft, target_probs, generator=None):
        if draft.tree is not None:
            return tree_accept(draft, target_probs, None, greedy=True)
        num, tokens = greedy_accept(draft.tokens, target_probs.argmax(-1), draft.lengths)
        return Acceptance(num, tokens)


class SpeculativeSampling(AcceptRule):
    """Leviathan et al. / Chen et al.: accept with min(1, p/q), resample the residual max(p − q, 0).

    Per step every row draws exactly K + 1 uniforms (K tests and one for the
    extra token), whatever it accepts, so a row's randomness never depends on
    the rest of its batch.
    """

    name = "speculative_sampling"
    lossless = True
    needs_draft_probs = True

    def __call__(self, draft, target_probs, generator=None):
        batch, k = draft.tokens.shape
        if draft.tree is not None:
            uniforms = draw_uniform(generator, batch, k + 2, target_probs.device)
            return tree_accept(draft, target_probs, uniforms, greedy=False)
        if draft.lengths is not None:
            return self._ragged(draft, target_probs, generator)
        uniforms = draw_uniform(generator, batch, k + 1, target_probs.device)
        num, tokens = speculative_accept(draft.tokens, draft.probs, target_probs, uniforms[:, :k], uniforms[:, k])
        return Acceptance(num, tokens)

    def _ragged(self, draft, target_probs, generator):
        """Ragged chains: row b draws exactly lengths[b] + 1 uniforms, so with one generator per row its
        samples do not depend on how long the other rows' drafts are."""
        batch, k = draft.tokens.shape
        lengths = draft.lengths
        drawn = draw_ragged_uniforms(generator, lengths + 1, k + 1, target_probs.device)
        rows = torch.arange(batch, device=drawn.device)
        residual = drawn[rows, lengths.to(drawn.device)]  # each row's last draw samples its extra token
        uniforms = drawn[:, :k] * (torch.arange(k, device=drawn.device)[None] < lengths.to(drawn.device)[:, None])
        num, tokens = speculative_accept(draft.tokens, draft.probs, target_probs, uniforms, residual,
                                         draft.lengths)
        return Acceptance(num, tokens)


def _child_table(tree: TreeSpec, device) -> torch.Tensor:
    """[N+1, C] children of each node in rank order, -1 padded."""
    kids = [tree.children(i) for i in range(tree.num_nodes + 1)]
    width = max(1, max(len(k) for k in kids))
    table = torch.full((len(kids), width), -1, dtype=torch.long)
    for i, k in enumerate(kids):
        k = sorted(k, key=lambda c: int(tree.rank[c]))
        table[i, : len(k)] = torch.tensor(k, dtype=torch.long)
    return table.to(device)


def tree_accept(draft: Draft, target_probs: torch.Tensor, uniforms: torch.Tensor | None, greedy: bool,
                relax=None) -> Acceptance:
    """Walk a static draft tree from the root, one depth at a time, for all rows at once.

    Greedy: descend into the child equal to the target argmax. Sampling: the
    children are deterministic proposals, tried in rank order; child x is kept
    with probability p'(x) where p' is the target distribution with the
    already rejected siblings removed and renormalised (lossless for
    deterministic multi-candidate drafts). If no child is kept, the extra token
    comes from p' (or is the bonus token at a leaf).
    uniforms: [B, N+2]; column i tests node i, the last column samples the extra token.

    relax(probs [B, V] normalised, tokens [B]) -> (relaxed probability [B], merged [B, k] token ids, -1
    padded): a relaxed test (LANTERN). Child x is then kept with probability relaxed(x) under the
    current residual, and a rejection removes x and the tokens merged into it; greedy keeps x when its
    relaxed probability reaches the target's maximum.
    """
    tree = draft.tree
    batch, device = draft.tokens.shape[0], draft.tokens.device
    rows = torch.arange(batch, device=device)
    node_tokens = torch.cat([torch.full((batch, 1), -1, device=device, dtype=torch.long), draft.tokens], 1)
    children = _child_table(tree, device)
    depth = tree.max_depth
    node = torch.zeros(batch, dtype=torch.long, device=device)
    active = torch.ones(batch, dtype=torch.bool, device=device)
    num = torch.zeros(batch, dtype=torch.long, device=device)
    tokens = torch.full((batch, depth + 1), -1, dtype=torch.long, device=device)
    path = torch.full((batch, depth + 1), -1, dtype=torch.long, device=device)
    path[:, 0] = 0
    for d in range(depth + 1):
        p = target_probs[rows, node].clone()  # [B, V] residual at the current node
        target_arg = p.argmax(-1)
        chosen = torch.full_like(node, -1)
        for c in range(children.shape[1]):
            cand = children[node, c]
            open_ = active & (cand >= 0) & (chosen < 0)
            tok = node_tokens[rows, cand.clamp(min=0)]
            p_tok = p[rows, tok.clamp(min=0)]
            if relax is not None:
                mass = p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
                relaxed, merged = relax(p / mass, tok.clamp(min=0))
            if greedy:
                ok = tok == target_arg if relax is None else (relaxed * mass[:, 0] >= p.amax(-1)) & (p_tok > 0)
            else:
                mass = p.sum(-1)
                test = p_tok if relax is None else relaxed * mass
                ok = uniforms[rows, cand.clamp(min=0)] * mass <= test
                if relax is not None:
                    ok &= p_tok > 0
                reject = open_ & ~ok
                p[rows[reject], tok[reject]] = 0.0
                if relax is not None:
                    drop = reject[:, None] & (merged >= 0)
                    p[rows[:, None].expand_as(merged)[drop], merged[drop]] = 0.0
            chosen = torch.where(open_ & ok, cand, chosen)
        descend = active & (chosen >= 0)
        finish = active & (chosen < 0)
        if finish.any():
            if greedy:
                extra = target_arg
            else:
                extra = sample_inverse_cdf(p, uniforms[:, -1])
            tokens[rows[finish], num[finish]] = extra[finish]
            active &= ~finish
        if descend.any():
            tokens[rows[descend], num[descend]] = node_tokens[rows[descend], chosen[descend]]
            num = num + descend.long()
            path[rows[descend], num[descend]] = chosen[descend]
            node = torch.where(descend, chosen, node)
        if not active.any():
            break
    return Acceptance(num, tokens, path_nodes=path)

