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
    # Chains: [B, K, V] processed draft distributions (None: deterministic drafts). Trees: [B, N+1, V], the draft
    # distribution at each node from which its first child (rank 0) was sampled; the other children are
    # deterministic proposals (None: every child is).
    probs: torch.Tensor | None = None
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


def tree_accept(draft: Draft, target_probs: torch.Tensor, uniforms: torch.Tensor | None, greedy: bool,
                relax=None) -> Acceptance:
    """Accept the longest path of a static draft tree, for all rows at once, with tensor ops only (no host
    reads: nothing here waits for the device).

    Greedy: descend into the child equal to the target argmax. Sampling: the
    children are deterministic proposals, tried in rank order; child x is kept
    with probability p'(x) where p' is the target distribution with the
    already rejected siblings removed and renormalised (lossless for
    deterministic multi-candidate drafts). If no child is kept, the extra token
    comes from p' (or is the bonus token at a leaf). With `draft.probs` (trees:
    the draft distribution q at each node), a node's first child was sampled from
    q: it is kept with probability min(1, p(x) / q(x)), as in a chain, and a
    rejection leaves the residual norm(max(0, p − q)) for the deterministic
    siblings after it (each step exact for the residual it is given, so the whole
    is lossless). On flat targets a sampled child is kept far more often than any
    top-ranked one.
    uniforms: [B, N+2]; column i tests node i, the last column samples the extra token.

    relax(probs [B, V] normalised, tokens [B]) -> (relaxed probability [B], merged [B, k] token ids, -1
    padded): a relaxed test (LANTERN). Child x is then kept with probability relaxed(x) under the
    current residual, and a rejection removes x and the tokens merged into it; greedy keeps x when its
    relaxed probability reaches the target's maximum.

    Greedy tests every node at once (a node's test depends only on its parent's distribution), so its cost
    does not grow with the tree's depth; sampling walks the levels, because a rejected sibling changes the
    residual the next sibling is tested against.
    """
    if greedy:
        return _tree_accept_greedy(draft, target_probs, relax)
    return _tree_accept_sampled(draft, target_probs, uniforms, relax)


def _batched(tree, batch: int, device):
    """The acceptance tables of a static tree (shared by all rows) or a dynamic one, batched [B, ...]."""
    tree = tree.on(device)
    if tree.depth.dim() == 2:  # a tree per row (`BatchTree`)
        return tree
    from .dynamic_tree import BatchTree

    expand = lambda t: t[None].expand(batch, *t.shape)  # noqa: E731
    return BatchTree(expand(tree.parent), expand(tree.depth), expand(tree.ancestor_mask), expand(tree.child_table),
                     expand(tree.path_table), expand(tree.earlier_sibling), tree.max_depth, tree.level_fan_out)


def _tree_accept_greedy(draft: Draft, target_probs: torch.Tensor, relax) -> Acceptance:
    device = draft.tokens.device
    batch, n = draft.tokens.shape
    tree = _batched(draft.tree, batch, device)
    nodes = n + 1
    rows = torch.arange(batch, device=device)[:, None]
    at_parent = target_probs[rows, tree.parent[:, 1:].clamp(min=0)]  # [B, N, V]: what each node is tested on
    tok = draft.tokens
    best = at_parent.amax(-1)
    if relax is None:
        ok = tok == at_parent.argmax(-1)
    else:
        flat = at_parent.reshape(batch * n, -1)
        mass = flat.sum(-1, keepdim=True).clamp_min(torch.finfo(flat.dtype).tiny)
        relaxed, _ = relax(flat / mass, tok.reshape(-1))
        p_tok = at_parent.gather(2, tok[..., None]).squeeze(2)
        ok = (relaxed.view(batch, n) * mass.view(batch, n) >= best) & (p_tok > 0)
    ok = torch.cat([torch.ones(batch, 1, dtype=torch.bool, device=device), ok], 1)  # the root is always kept
    # A node is taken when it passes, no sibling tried before it passed, and every ancestor was taken.
    earlier_passed = torch.bmm(tree.earlier_sibling.float(), ok.float()[:, :, None])[:, :, 0] > 0
    taken = ok & ~earlier_passed
    on_path = torch.bmm(tree.ancestor_mask.float(), taken.float()[:, :, None])[:, :, 0] == (tree.depth + 1).float()
    # The deepest node on the path (one per depth: siblings exclude each other).
    score = torch.where(on_path, tree.depth * nodes + torch.arange(nodes, device=device)[None], -1)
    last = score.argmax(1)  # [B]
    num = tree.depth.gather(1, last[:, None]).squeeze(1)
    path = tree.path_table[rows[:, 0], last]  # [B, D+1] the kept nodes by depth, -1 past the last
    node_tokens = torch.cat([torch.full((batch, 1), -1, dtype=torch.long, device=device), tok], 1)
    tokens = node_tokens.gather(1, path[:, 1:].clamp(min=0))  # [B, D]: kept drafts
    extra = target_probs[rows[:, 0], last].argmax(-1)
    width = tree.max_depth + 1
    columns = torch.arange(width, device=device)[None]
    tokens = torch.cat([tokens, tokens.new_zeros(batch, 1)], 1)
    tokens = torch.where(columns < num[:, None], tokens, torch.where(columns == num[:, None], extra[:, None], -1))
    return Acceptance(num, tokens, path_nodes=path)


def _tree_accept_sampled(draft: Draft, target_probs: torch.Tensor, uniforms: torch.Tensor, relax) -> Acceptance:
    device = draft.tokens.device
    batch = draft.tokens.shape[0]
    if draft.probs is not None and relax is not None:
        raise ValueError("a relaxed tree test takes deterministic children only (draft.probs must be None)")
    tree = _batched(draft.tree, batch, device)
    rows = torch.arange(batch, device=device)
    node_tokens = torch.cat([torch.full((batch, 1), -1, device=device, dtype=torch.long), draft.tokens], 1)
    children = tree.child_table
    depth = tree.max_depth
    node = torch.zeros(batch, dtype=torch.long, device=device)
    active = torch.ones(batch, dtype=torch.bool, device=device)
    num = torch.zeros(batch, dtype=torch.long, device=device)
    tokens = torch.full((batch, depth + 1), -1, dtype=torch.long, device=device)
    path = torch.full((batch, depth + 1), -1, dtype=torch.long, device=device)
    path[:, 0] = 0

    def put(table: torch.Tensor, column: torch.Tensor, value: torch.Tensor, where_: torch.Tensor) -> None:
        """table[b, column[b]] = value[b] where where_[b], in place, without a boolean index."""
        old = table.gather(1, column[:, None]).squeeze(1)
        table.scatter_(1, column[:, None], torch.where(where_, value, old)[:, None])

    final = None  # [B, V] the residual at each row's last node
    for level in range(depth + 1):
        p = target_probs[rows, node].clone()  # [B, V] residual at the current node
        chosen = torch.full_like(node, -1)
        for c in range(tree.level_fan_out[level]):  # rows sit at this depth: no node here has more children
            cand = children[rows, node, c]
            open_ = active & (cand >= 0) & (chosen < 0)
            tok = node_tokens[rows, cand.clamp(min=0)].clamp(min=0)
            p_tok = p.gather(1, tok[:, None]).squeeze(1)
            mass = p.sum(-1)
            if c == 0 and draft.probs is not None:  # sampled from q: the chain's test, then p <- max(0, p - q)
                q = draft.probs[rows, node]
                q_tok = q.gather(1, tok[:, None]).squeeze(1)
                ok = (uniforms[rows, cand.clamp(min=0)] * q_tok * mass <= p_tok) & (p_tok > 0)
                reject = open_ & ~ok
                residual = (p / mass.clamp_min(torch.finfo(p.dtype).tiny)[:, None] - q).clamp(min=0)
                p = torch.where(reject[:, None], residual, p)
                chosen = torch.where(open_ & ok, cand, chosen)
                continue
            if relax is None:
                test = p_tok
            else:
                relaxed, merged = relax(p / mass.clamp_min(torch.finfo(p.dtype).tiny)[:, None], tok)
                test = relaxed * mass
            ok = (uniforms[rows, cand.clamp(min=0)] * mass <= test) & (p_tok > 0)
            reject = open_ & ~ok
            keep = torch.ones_like(p).scatter_(1, tok[:, None], (~reject).to(p.dtype)[:, None])
            if relax is not None:  # the tokens merged into a rejected x leave the residual with it
                drop = reject[:, None] & (merged >= 0)
                keep = keep.scatter_reduce(1, merged.clamp(min=0), (~drop).to(p.dtype), reduce="prod")
            p = p * keep
            chosen = torch.where(open_ & ok, cand, chosen)
        descend = active & (chosen >= 0)
        finish = active & (chosen < 0)
        # A row's extra token comes from the residual where it stops: keep that, draw once after the walk.
        final = p if final is None else torch.where(finish[:, None], p, final)
        active = active & ~finish
        put(tokens, num, node_tokens.gather(1, chosen.clamp(min=0)[:, None]).squeeze(1), descend)
        num = num + descend.long()
        put(path, num, chosen, descend)
        node = torch.where(descend, chosen, node)
    tokens.scatter_(1, num[:, None], sample_inverse_cdf(final, uniforms[:, -1])[:, None])
    return Acceptance(num, tokens, path_nodes=path)
