"""Static draft trees (Medusa / EAGLE style).

A tree is given by its node paths: each node is the tuple of child ranks from
the root, e.g. `(0,)` is the root's best child and `(0, 1)` that child's
second-best child. Node 0 is the root (the last committed token); nodes
1..N are draft tokens, ordered by depth then by path.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

import torch


class LevelIndex(NamedTuple):
    """One depth of a static tree, as index tensors for drafting it."""
    nodes: torch.Tensor  # [L] node ids at this depth
    parents: torch.Tensor  # [L] each one's parent
    ranks: torch.Tensor  # [L] each one's rank among its siblings
    expanding: torch.Tensor  # [E] the ids of those with children: only they need a drafter forward (a leaf's
    #                          own prediction is never read)
    expanding_parents: torch.Tensor  # [E] their parents


@dataclass(frozen=True)
class TreeSpec:
    paths: tuple[tuple[int, ...], ...]  # one per draft node, sorted by (depth, path)
    parent: torch.Tensor = field(repr=False)  # [N+1] long; parent node of each node, -1 for the root
    depth: torch.Tensor = field(repr=False)  # [N+1] long; root at depth 0, also the position offset
    ancestor_mask: torch.Tensor = field(repr=False)  # [N+1, N+1] bool; [i, j] = j is i or an ancestor of i
    retrieve_paths: torch.Tensor = field(repr=False)  # [num_leaves, max_depth+1] long; root-to-leaf node ids, -1 padded
    rank: torch.Tensor = field(repr=False)  # [N+1] long; child rank of each node among its siblings, -1 for the root
    # Host-side copies and derived tables, so drafting and acceptance never read the tree back from a device.
    parents: tuple[int, ...] = field(repr=False, default=())  # parent[i] as ints
    ranks: tuple[int, ...] = field(repr=False, default=())  # rank[i] as ints
    levels: tuple[tuple[int, ...], ...] = field(repr=False, default=())  # node ids at each depth 0..max_depth
    level_fan_out: tuple[int, ...] = field(repr=False, default=())  # the most children of a node at each depth
    child_table: torch.Tensor = field(repr=False, default=None)  # [N+1, C] long; children in rank order, -1 padded
    path_table: torch.Tensor = field(repr=False, default=None)  # [N+1, D+1] long; [i, d] = i's ancestor at depth d
    earlier_sibling: torch.Tensor = field(repr=False, default=None)  # [N+1, N+1] bool; [i, j] = j is a sibling
    #                                                                  of i ranked before it
    _device_copies: dict = field(repr=False, default_factory=dict, compare=False)

    @classmethod
    def from_paths(cls, paths) -> "TreeSpec":
        paths = [tuple(int(r) for r in p) for p in paths]
        if not paths:
            raise ValueError("paths must name at least one draft node")
        if len(set(paths)) != len(paths):
            raise ValueError("paths contains duplicate nodes")
        for p in paths:
            if len(p) == 0 or any(r < 0 for r in p):
                raise ValueError(f"every path must be a non-empty tuple of ranks >= 0, got {p}")
            if len(p) > 1 and p[:-1] not in paths:
                raise ValueError(f"path {p} has no parent {p[:-1]} in paths")
        ordered = sorted(paths, key=lambda p: (len(p), p))
        index = {(): 0} | {p: i + 1 for i, p in enumerate(ordered)}
        n = len(ordered) + 1
        parent = torch.full((n,), -1, dtype=torch.long)
        depth = torch.zeros(n, dtype=torch.long)
        rank = torch.full((n,), -1, dtype=torch.long)
        for p, i in index.items():
            if p:
                parent[i], depth[i], rank[i] = index[p[:-1]], len(p), p[-1]
        ancestor = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            ancestor[i] = ancestor[int(parent[i])]
            ancestor[i, i] = True
        has_child = torch.zeros(n, dtype=torch.bool)
        has_child[parent[1:]] = True
        leaves = [i for i in range(n) if not has_child[i]]
        max_depth = int(depth.max())
        retrieve = torch.full((len(leaves), max_depth + 1), -1, dtype=torch.long)
        for row, leaf in enumerate(leaves):
            chain = ancestor[leaf].nonzero().flatten()  # ancestors sorted by id, hence by depth
            retrieve[row, : len(chain)] = chain
        parents, ranks = tuple(parent.tolist()), tuple(rank.tolist())
        levels = tuple(tuple(i for i in range(n) if int(depth[i]) == d) for d in range(max_depth + 1))
        kids = [sorted((c for c in range(1, n) if parents[c] == i), key=lambda c: ranks[c]) for i in range(n)]
        child_table = torch.full((n, max(1, max(len(k) for k in kids))), -1, dtype=torch.long)
        for i, k in enumerate(kids):
            child_table[i, : len(k)] = torch.tensor(k, dtype=torch.long)
        path_table = torch.full((n, max_depth + 1), -1, dtype=torch.long)
        for i in range(n):
            for j in ancestor[i].nonzero().flatten().tolist():
                path_table[i, int(depth[j])] = j
        earlier = (parent[:, None] == parent[None, :]) & (rank[None, :] < rank[:, None])
        earlier[0] = False
        earlier[:, 0] = False
        fan_out = tuple(max(len(kids[i]) for i in level) for level in levels)
        return cls(tuple(ordered), parent, depth, ancestor, retrieve, rank, parents, ranks, levels, fan_out,
                   child_table, path_table, earlier)

    @classmethod
    def chain(cls, length: int) -> "TreeSpec":
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        return cls.from_paths([(0,) * d for d in range(1, length + 1)])

    @classmethod
    def full(cls, branching: list[int]) -> "TreeSpec":
        """Every node at depth d has branching[d] children, e.g. [2, 2] -> 6 draft nodes."""
        if not branching or any(b < 1 for b in branching):
            raise ValueError(f"branching must be a non-empty list of ints >= 1, got {branching}")
        level, paths = [()], []
        for b in branching:
            level = [p + (r,) for p in level for r in range(b)]
            paths += level
        return cls.from_paths(paths)

    @property
    def num_nodes(self) -> int:
        """Draft nodes, excluding the root."""
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return len(self.levels) - 1

    def children(self, node: int) -> list[int]:
        """The node's children in rank order."""
        return [c for c in self.child_table[node].tolist() if c >= 0]

    def nodes_at_depth(self, d: int) -> list[int]:
        return list(self.levels[d])

    def level_index(self, d: int, device) -> "LevelIndex":
        """Index tensors for drafting depth d (>= 1), from host tables (no device reads); built once per depth
        and device, then reused."""
        key = ("level", d, str(torch.device(device)))
        if key not in self._device_copies:
            nodes, parents = self.levels[d], set(self.parents)
            expanding = [n for n in nodes if n in parents]
            self._device_copies[key] = LevelIndex(*(torch.tensor(ids, dtype=torch.long, device=device) for ids in (
                nodes, [self.parents[n] for n in nodes], [self.ranks[n] for n in nodes], expanding,
                [self.parents[n] for n in expanding])))
        return self._device_copies[key]

    def on(self, device) -> "TreeSpec":
        """This tree with its tensors on `device` (copied once per device, then reused)."""
        device = torch.device(device)
        if self.depth.device == device:
            return self
        key = str(device)
        if key not in self._device_copies:
            moved = {name: getattr(self, name).to(device) for name in
                     ("parent", "depth", "ancestor_mask", "retrieve_paths", "rank", "child_table", "path_table",
                      "earlier_sibling")}
            self._device_copies[key] = dataclasses.replace(self, **moved, _device_copies={})
        return self._device_copies[key]


def parse_branching(text, field: str = "tree_branching") -> TreeSpec | None:
    """A static tree from a config string: children per depth such as "3,2,1" (every node at depth d has
    that many), or node paths separated by ';' such as "0;1;0.0;0.0.0" (rank of each child from the root,
    dot-separated: any shape, e.g. one `mmspec plan-tree` printed); "" means a chain (None). `field` names
    the config field in errors."""
    if isinstance(text, int) and not isinstance(text, bool):  # `--set tree_branching=3` parses as an int
        text = str(text)
    if not isinstance(text, str):
        raise ValueError(f"{field} must be a string like '3,2,1' or '0;1;0.0' ('' = chain), got {text!r}")
    if not text:
        return None
    if ";" in text:
        return _parse_paths(text, field)
    try:
        branching = [int(b) for b in str(text).split(",")]
    except ValueError:
        raise ValueError(f"{field} must be comma-separated ints >= 1 like '3,2,1', or ';'-separated node paths "
                         f"like '0;1;0.0', got {text!r}") from None
    if any(b < 1 for b in branching):
        raise ValueError(f"{field} entries must be >= 1, got {text!r}")
    return TreeSpec.full(branching)


def _parse_paths(text: str, field: str) -> TreeSpec:
    try:
        paths = [tuple(int(r) for r in part.strip().split(".")) for part in text.split(";") if part.strip()]
    except ValueError:
        raise ValueError(f"{field}: node paths are dot-separated child ranks >= 0 separated by ';' like "
                         f"'0;1;0.0', got {text!r}") from None
    try:
        tree = TreeSpec.from_paths(paths)
    except ValueError as err:
        raise ValueError(f"{field}: {err} (in {text!r})") from None
    # Drafters give a node its top-n tokens, so a rank needs its earlier siblings (trees a plugin builds
    # itself, such as ptp's register groups, may number children otherwise).
    for p in tree.paths:
        if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in tree.paths:
            raise ValueError(f"{field}: path {'.'.join(map(str, p))} has no earlier sibling "
                             f"{'.'.join(map(str, p[:-1] + (p[-1] - 1,)))}: a node's children must be ranks "
                             f"0, 1, ... without gaps (in {text!r})")
    return tree


def format_paths(tree: TreeSpec) -> str:
    """The `tree_branching` string that names `tree` node by node ("0;1;0.0"); `parse_branching` reads it.
    A one-node tree is "0;" (the ';' marks node paths: "1" would be children per depth)."""
    text = ";".join(".".join(str(r) for r in p) for p in tree.paths)
    return text if len(tree.paths) > 1 else text + ";"
