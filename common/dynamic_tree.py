"""Dynamic draft trees (EAGLE-2, Li et al. 2024, arXiv:2406.16858): each row grows its own tree.

A static tree (`TreeSpec`) spends its node budget on the same shape whatever the drafter believes. EAGLE-2
spends it where the draft is confident, per row and per step:

- expansion: from the root, keep a frontier of the `top_k` nodes with the highest cumulative draft
  log-probability (the drafter's estimate that the whole path is accepted); each frontier node proposes its
  own `top_k` best tokens; the best `top_k` of those `top_k²` children become the next frontier. After
  `depth` levels the candidates are every node proposed: `top_k + (depth - 1)·top_k²`.
- reranking: the `total_tokens` candidates with the highest cumulative log-probability form the tree that
  is verified. A child never scores above its parent (log-probabilities are <= 0; ties go to the
  shallower node), so the chosen set contains every chosen node's ancestors.

`DynamicTreeBuilder` runs this for a batch with tensor ops only (no host reads): the drafter calls `root`
with the root's draft distribution, feeds the returned frontier through its model (`fed_tree` gives the
attention structure among the nodes it has fed), calls `expand` with their distributions, and `finish`
returns the verify tree as a `BatchTree`. Children are deterministic proposals (top-ranked tokens), so the
core's multi-candidate tree acceptance keeps sampling lossless, exactly as for static trees.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import DynamicTreeConfig  # noqa: F401  (re-exported: plugins' configs extend it)


@dataclass
class BatchTree:
    """A draft tree per row, every row with the same number of nodes (node 0: the root, the last committed
    token). The fields `tree_accept`, the slot table and the verify pass read, batched: [B, ...]."""
    parent: torch.Tensor  # [B, N+1] long; -1 for the root
    depth: torch.Tensor  # [B, N+1] long; also each node's position offset
    ancestor_mask: torch.Tensor  # [B, N+1, N+1] bool; [b, i, j] = j is i or an ancestor of i
    child_table: torch.Tensor  # [B, N+1, C] long; children in the order acceptance tries them, -1 padded
    path_table: torch.Tensor  # [B, N+1, D+1] long; [b, i, d] = i's ancestor at depth d, -1 past i's depth
    earlier_sibling: torch.Tensor  # [B, N+1, N+1] bool; [b, i, j] = j is a sibling tried before i
    max_depth: int  # on the host: the deepest any row's tree may be
    level_fan_out: tuple[int, ...]  # on the host: the most children a node at each depth may have
    fed_ids: torch.Tensor | None = None  # [B, N+1] long; each node's id in the drafter's `FedTree`, -1 if unfed

    @property
    def num_nodes(self) -> int:
        """Draft nodes per row, excluding the root."""
        return self.parent.shape[1] - 1

    def on(self, device) -> "BatchTree":
        return self  # built where its draft lives


def check_dynamic_tree(depth: int, top_k: int, total_tokens: int, owner: str = "config") -> None:
    """One line naming the setting at fault (depth 0 means no dynamic tree)."""
    if depth == 0:
        return
    if depth < 1:
        raise ValueError(f"{owner}.tree_depth must be >= 1 for a dynamic tree (0 = none), got {depth}")
    if top_k < 1:
        raise ValueError(f"{owner}.tree_top_k must be >= 1, got {top_k}")
    most = top_k + (depth - 1) * top_k * top_k
    if not 1 <= total_tokens <= most:
        raise ValueError(f"{owner}.tree_total_tokens must be between 1 and top_k + (depth - 1) * top_k^2 = {most} "
                         f"(the candidates a tree of depth {depth} and top_k {top_k} proposes), got {total_tokens}")


def dynamic_tree_settings(config, static_tree, owner: str) -> tuple[int, int, int] | None:
    """(depth, top_k, total_tokens) when `config` asks for a dynamic tree, else None; one line if it also asks
    for a static one or the settings do not fit."""
    if not config.tree_depth:
        return None
    if static_tree is not None:
        raise ValueError(f"{owner}: tree_depth > 0 asks for a dynamic tree, tree_branching "
                         f"{config.tree_branching!r} for a static one; set tree_branching='' or tree_depth=0")
    settings = (config.tree_depth, config.tree_top_k, config.tree_total_tokens)
    check_dynamic_tree(*settings, owner)
    return settings


class FedTree:
    """The nodes a drafter has fed to its own model while expanding (the frontiers), as the slot table sees a
    pending tree: node 0 the root, then `top_k` nodes per fed level, ancestors filled as levels are fed."""

    def __init__(self, batch: int, depth: int, top_k: int, device):
        size = 1 + max(0, depth - 1) * top_k
        self.ancestor_mask = torch.eye(size, dtype=torch.bool, device=device).expand(batch, -1, -1).clone()
        self.top_k = top_k

    def level_nodes(self, level: int) -> torch.Tensor:
        """[top_k] the fed-tree ids of the frontier fed at `level` (1-based), on the host."""
        return torch.arange(1 + (level - 1) * self.top_k, 1 + level * self.top_k)

    def add_level(self, level: int, parents: torch.Tensor) -> None:
        """parents [B, top_k]: the fed-tree id of each new frontier node's parent."""
        ids = self.level_nodes(level).to(parents.device)
        rows = self.ancestor_mask.gather(1, parents[:, :, None].expand(-1, -1, self.ancestor_mask.shape[2]))
        rows = rows.clone()
        rows[:, torch.arange(ids.numel()), ids] = True
        self.ancestor_mask[:, ids] = rows


class DynamicTreeBuilder:
    def __init__(self, batch: int, depth: int, top_k: int, total_tokens: int, device):
        check_dynamic_tree(depth, top_k, total_tokens, "DynamicTreeBuilder")
        self.batch, self.depth, self.top_k, self.total = batch, depth, top_k, total_tokens
        self.device = device
        self.fed_tree = FedTree(batch, depth, top_k, device)
        # The candidate pool, one column per proposed node, in the order they were proposed.
        self._tokens: list[torch.Tensor] = []  # [B, n] each
        self._scores: list[torch.Tensor] = []
        self._parent: list[torch.Tensor] = []  # pool index of the parent, -1 = the root
        self._depth: list[int] = []
        self._pool_size = 0
        self._frontier_pool = None  # [B, k] pool indices of the current frontier
        self._frontier_scores = None
        self._fed: list[tuple[torch.Tensor, torch.Tensor]] = []  # (pool indices [B, k], their fed-tree ids [k])

    def _add(self, tokens, scores, parent, depth) -> torch.Tensor:
        n = tokens.shape[1]
        index = torch.arange(self._pool_size, self._pool_size + n, device=self.device)
        self._tokens.append(tokens)
        self._scores.append(scores)
        self._parent.append(parent)
        self._depth += [depth] * n
        self._pool_size += n
        return index

    def root(self, logp: torch.Tensor) -> torch.Tensor:
        """logp [B, V]: the root's draft log-probabilities. Returns the first frontier's tokens [B, top_k]
        (the root's best tokens, all of them candidates), fed next as `fed_tree` level 1."""
        scores, tokens = logp.float().topk(self.top_k, -1)
        index = self._add(tokens, scores, torch.full_like(tokens, -1), 1)
        self._frontier_pool = index[None].expand(self.batch, -1)
        self._frontier_scores = scores
        if self.depth > 1:
            self.fed_tree.add_level(1, torch.zeros(self.batch, self.top_k, dtype=torch.long, device=self.device))
            self._fed.append((self._frontier_pool, self.fed_tree.level_nodes(1).to(self.device)))
        return tokens

    def expand(self, logp: torch.Tensor, level: int) -> tuple[torch.Tensor, torch.Tensor]:
        """logp [B, top_k, V]: draft log-probabilities after each node of the frontier fed at `level`.
        Returns the next frontier: tokens [B, top_k] and which node of the fed frontier is each one's parent
        ([B, top_k] in 0..top_k-1); it is `fed_tree` level `level + 1` when the tree goes that deep."""
        k = self.top_k
        child_logp, child_tokens = logp.float().topk(k, -1)  # [B, k, k]
        child_tokens = child_tokens.reshape(self.batch, k * k)
        scores = (self._frontier_scores[:, :, None] + child_logp).reshape(self.batch, k * k)
        parents = self._frontier_pool[:, :, None].expand(-1, -1, k).reshape(self.batch, k * k)
        index = self._add(child_tokens, scores, parents, level + 1)
        best_scores, best = scores.topk(k, -1)  # the next frontier
        self._frontier_pool = index[best]
        self._frontier_scores = best_scores
        parent_in_frontier = torch.div(best, k, rounding_mode="floor")
        if level + 1 < self.depth:
            fed_ids = self.fed_tree.level_nodes(level).to(self.device)
            self.fed_tree.add_level(level + 1, fed_ids[parent_in_frontier])
            self._fed.append((self._frontier_pool, self.fed_tree.level_nodes(level + 1).to(self.device)))
        return child_tokens.gather(1, best), parent_in_frontier

    def finish(self) -> tuple[torch.Tensor, BatchTree]:
        """The verify tree: the `total_tokens` best candidates per row, ordered by depth (then by score), as
        draft tokens [B, N] and a `BatchTree`."""
        batch, n, device = self.batch, self.total, self.device
        tokens = torch.cat(self._tokens, 1)
        scores = torch.cat(self._scores, 1)
        parent = torch.cat(self._parent, 1)
        depth = torch.tensor(self._depth, device=device)[None].expand(batch, -1)
        # Best score first, ties to the shallower node (then to the earlier proposal): parents before children.
        by_depth = torch.sort(depth, dim=1, stable=True).indices
        by_score = torch.sort(-scores.gather(1, by_depth), dim=1, stable=True).indices
        chosen = by_depth.gather(1, by_score)[:, :n]
        # Verify order: by depth, keeping the score order within a depth.
        chosen = chosen.gather(1, torch.sort(depth.gather(1, chosen), dim=1, stable=True).indices)
        verify_id = torch.full((batch, self._pool_size), -1, dtype=torch.long, device=device)
        verify_id.scatter_(1, chosen, torch.arange(1, n + 1, device=device)[None].expand(batch, -1))
        chosen_parent = parent.gather(1, chosen)
        node_parent = torch.where(chosen_parent < 0, 0, verify_id.gather(1, chosen_parent.clamp(min=0)))
        root = torch.zeros(batch, 1, dtype=torch.long, device=device)
        tree = build_batch_tree(torch.cat([root - 1, node_parent], 1), torch.cat([root, depth.gather(1, chosen)], 1),
                                self.depth, (self.top_k,) * self.depth + (0,))
        fed_of_pool = torch.full((batch, self._pool_size), -1, dtype=torch.long, device=device)
        for pool, ids in self._fed:
            fed_of_pool.scatter_(1, pool, ids[None].expand(batch, -1))
        tree.fed_ids = torch.cat([root, fed_of_pool.gather(1, chosen)], 1)
        return tokens.gather(1, chosen), tree


def build_batch_tree(parent: torch.Tensor, depth: torch.Tensor, max_depth: int,
                     level_fan_out: tuple[int, ...]) -> BatchTree:
    """The batched tables from each row's parents [B, N+1] (root -1) and depths, nodes ordered by depth and,
    among siblings, in the order acceptance should try them."""
    batch, nodes = parent.shape
    device = parent.device
    ids = torch.arange(nodes, device=device)
    up = parent.clamp(min=0)
    ancestor = torch.eye(nodes, dtype=torch.bool, device=device).expand(batch, -1, -1).clone()
    for _ in range(max_depth):  # each pass adds one more generation of ancestors
        ancestor = ancestor | ancestor.gather(1, up[:, :, None].expand(-1, -1, nodes))
        ancestor[:, 0] = False
        ancestor[:, 0, 0] = True
    siblings = (parent[:, :, None] == parent[:, None, :]) & (parent[:, :, None] >= 0)
    earlier = siblings & (ids[None, None, :] < ids[None, :, None])
    column = earlier.sum(2)  # [B, N+1]: each node's place among its siblings
    width = max(1, max(level_fan_out))
    child_table = torch.full((batch, nodes, width), -1, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)[:, None].expand(-1, nodes - 1)
    child_table[rows, up[:, 1:], column[:, 1:].clamp(max=width - 1)] = ids[1:][None].expand(batch, -1)
    path = torch.full((batch, nodes, max_depth + 1), -1, dtype=torch.long, device=device)
    value = torch.where(ancestor, ids[None, None, :], -1)
    path = path.scatter_reduce(2, depth[:, None, :].expand(-1, nodes, -1), value, reduce="amax")
    return BatchTree(parent, depth, ancestor, child_table, path, earlier, max_depth, level_fan_out)
