"""Per-row KV slot bookkeeping that makes ragged batches and tree verification cheap.

A KV cache is a tensor [B, heads, S, dim] whose slots are shared by all rows,
but each row decides for itself which slots are live. Attention does not care
about the physical order of keys (RoPE is baked into them), so:

- rolling a row back (`crop`) only marks slots dead, no data moves;
- tree verification writes every node, and `keep` marks the accepted path
  live and the siblings dead;
- new tokens are always appended at the end, for every row at once.

Dead slots are masked out; `compaction_index` occasionally gathers live slots
to the front so the cache does not grow with the number of rejected drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import TreeSpec


@dataclass
class SlotTable:
    positions: torch.Tensor  # [B, S] long; sequence position of each slot's token
    live: torch.Tensor  # [B, S] bool; slot holds a token of this row's current sequence
    tree_node: torch.Tensor  # [B, S] long; node id in the pending tree block, -1 when not a pending tree slot
    tree: TreeSpec | None = None  # the pending tree block, until `keep` resolves it
    tidy_at: int = 0  # slot count from which the adapter tidies again (a host sync; amortised over many steps)
    tidy_wait: int = 0  # rollbacks (crop / keep) to let pass before the next tidy

    @classmethod
    def empty(cls, batch: int, device) -> "SlotTable":
        return cls(
            positions=torch.empty(batch, 0, dtype=torch.long, device=device),
            live=torch.empty(batch, 0, dtype=torch.bool, device=device),
            tree_node=torch.empty(batch, 0, dtype=torch.long, device=device),
        )

    @property
    def batch_size(self) -> int:
        return self.positions.shape[0]

    @property
    def num_slots(self) -> int:
        return self.positions.shape[1]

    def lengths(self) -> torch.Tensor:
        """[B] live tokens per row."""
        return self.live.sum(1)

    def attention_mask(
        self,
        positions: torch.Tensor,  # [B, L] positions of the new tokens
        token_mask: torch.Tensor | None = None,  # [B, L] bool; False marks padding
        tree_nodes: torch.Tensor | None = None,  # [L] long; node ids when the new tokens are tree nodes
        tree: TreeSpec | None = None,
        query_only: torch.Tensor | None = None,  # [B, L] bool; True: attends normally, but no one sees it
    ) -> torch.Tensor:
        """[B, L, S+L] bool: which keys (old slots, then the new tokens) each new token sees."""
        batch, new = positions.shape
        if token_mask is None:
            token_mask = torch.ones_like(positions, dtype=torch.bool)
        if query_only is None:
            query_only = torch.zeros_like(token_mask)
        key_pos = torch.cat([self.positions, positions], 1)
        key_live = torch.cat([self.live, token_mask & ~query_only], 1)
        new_nodes = (tree_nodes.to(positions.device).expand(batch, new) if tree_nodes is not None
                     else torch.full_like(positions, -1))
        key_node = torch.cat([self.tree_node, new_nodes], 1)
        mask = key_live[:, None, :] & (key_pos[:, None, :] <= positions[:, :, None])
        if tree is not None or self.tree is not None:
            spec = tree if tree is not None else self.tree
            anc = spec.ancestor_mask.to(positions.device)
            q_node, k_node = new_nodes[:, :, None], key_node[:, None, :]
            both = (q_node >= 0) & (k_node >= 0)
            if anc.dim() == 2:  # one tree for every row
                related = anc[q_node.clamp(min=0), k_node.clamp(min=0)]
            else:  # a tree per row (dynamic trees); guidance runs each row twice: [cond rows; uncond rows]
                if anc.shape[0] != batch:
                    anc = anc.repeat(batch // anc.shape[0], 1, 1)
                rows = torch.arange(batch, device=positions.device)[:, None, None]
                related = anc[rows, q_node.clamp(min=0), k_node.clamp(min=0)]
            mask &= ~both | related
        # A chain token must never see another token at its own position (a stale draft or a sibling).
        same_pos = key_pos[:, None, :] == positions[:, :, None]
        new_idx = torch.arange(new, device=positions.device)
        is_self = torch.zeros_like(mask)
        is_self[:, new_idx, self.num_slots + new_idx] = True
        mask &= ~same_pos | is_self
        # Padding queries see only themselves so their (discarded) softmax is well defined;
        # a query-only token still sees itself.
        mask |= is_self & (~token_mask | query_only)[:, :, None]
        return mask

    def append(self, positions, token_mask=None, tree_nodes=None, tree: TreeSpec | None = None,
               query_only=None) -> None:
        batch, new = positions.shape
        if token_mask is None:
            token_mask = torch.ones_like(positions, dtype=torch.bool)
        if query_only is not None:  # fed for its output only: never part of the sequence
            token_mask = token_mask & ~query_only
        nodes = (tree_nodes.to(positions.device).expand(batch, new) if tree_nodes is not None
                 else torch.full_like(positions, -1))
        if tree is not None:
            if self.tree is not None and self.tree is not tree:
                raise RuntimeError("a different tree block is still pending; call keep() first")
            self.tree = tree
        elif self.tree is not None:
            raise RuntimeError("a tree block is pending; call keep() before appending plain tokens")
        self.positions = torch.cat([self.positions, positions], 1)
        self.live = torch.cat([self.live, token_mask], 1)
        self.tree_node = torch.cat([self.tree_node, nodes], 1)

    def crop(self, lengths: torch.Tensor) -> None:
        """Row b keeps only positions < lengths[b]."""
        self.live &= self.positions < lengths.to(self.positions.device)[:, None]

    def release(self, positions: torch.Tensor) -> None:
        """Row b forgets its tokens at positions[b] ([B, n], -1 = none), wherever they sit in the sequence."""
        positions = positions.to(self.positions.device)
        hit = (self.positions[:, :, None] == positions[:, None, :]) & (positions[:, None, :] >= 0)
        self.live &= ~hit.any(-1)

    def keep(self, path_nodes: torch.Tensor) -> None:
        """Resolve the pending tree: row b keeps the nodes listed in path_nodes[b] ([B, P], -1 padded)."""
        if self.tree is None:
            raise RuntimeError("keep() needs a pending tree block")
        pending = self.tree_node >= 0
        kept = (self.tree_node[:, :, None] == path_nodes[:, None, :]) & (path_nodes[:, None, :] >= 0)
        self.live &= ~pending | kept.any(-1)
        self.tree_node = torch.full_like(self.tree_node, -1)
        self.tree = None

    def select_rows(self, rows: torch.Tensor) -> None:
        self.positions, self.live, self.tree_node = self.positions[rows], self.live[rows], self.tree_node[rows]

    def append_rows(self, other: "SlotTable") -> None:
        """Put `other`'s rows after this table's rows; the side with fewer slots gets dead ones at its end."""
        if self.tree is not None or other.tree is not None:
            raise RuntimeError("rows cannot be appended while a tree block is pending; call keep() first")
        width = max(self.num_slots, other.num_slots)

        def widen(t: torch.Tensor, fill) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)

        self.positions = torch.cat([widen(self.positions, 0), widen(other.positions.to(self.positions.device), 0)])
        self.live = torch.cat([widen(self.live, False), widen(other.live.to(self.live.device), False)])
        self.tree_node = torch.cat([widen(self.tree_node, -1), widen(other.tree_node.to(self.tree_node.device), -1)])

    def tidy_plan(self) -> tuple[int, int]:
        """(slots at the end that are dead in every row: safe to drop physically, most live slots in a row),
        read together: one host sync."""
        if not self.batch_size or not self.num_slots:
            return self.num_slots, 0
        index = torch.arange(self.num_slots, device=self.live.device)
        last_live = torch.where(self.live.any(0), index, -1).max()
        last_live, max_live = torch.stack([last_live, self.lengths().max()]).tolist()
        return self.num_slots - 1 - last_live, max_live

    def drop_trailing(self, count: int) -> None:
        if count:
            keep = self.num_slots - count
            self.positions, self.live, self.tree_node = (
                self.positions[:, :keep], self.live[:, :keep], self.tree_node[:, :keep])

    def compaction_index(self, max_live: int, slack: int = 64) -> torch.Tensor | None:
        """[B, S'] gather index moving live slots to the front, or None when not worth it. max_live: the most
        live slots of any row (`tidy_plan`)."""
        if self.tree is not None or self.num_slots <= max_live + slack:
            return None
        order = torch.sort((~self.live).to(torch.int8), dim=1, stable=True).indices[:, :max_live]
        self.positions = self.positions.gather(1, order)
        self.live = self.live.gather(1, order)
        self.tree_node = self.tree_node.gather(1, order)
        return order


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, L, S] bool -> [B, 1, L, S] additive float mask (0 visible, dtype min hidden)."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    out.masked_fill_(~mask, torch.finfo(dtype).min)
    return out[:, None]
