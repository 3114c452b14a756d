"""Drafters: where speculative tokens come from.

The decoder hands a drafter a `StepContext` (last committed token and its
position per row) and gets back a `Draft`; after verification it calls
`commit` so the drafter can roll its own state back to what was accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .accept import Acceptance, Draft
from .kernels import sample_inverse_cdf
from .logits import LogitsPipeline, draw_uniform
from .model import ARModel, DecodeState, ModelOutput
from .dynamic_tree import DynamicTreeBuilder, check_dynamic_tree
from .tree import TreeSpec


def sampled_first_children(q: torch.Tensor, uniforms: torch.Tensor, fan_out: int) -> torch.Tensor:
    """Children of tree nodes whose first child is sampled (`tree_accept` with `Draft.probs`): q [..., V] each
    node's draft distribution, uniforms [...] one draw per node -> [..., fan_out] tokens: the token drawn from
    q, then q's top-ranked tokens other than it, in rank order."""
    drawn = sample_inverse_cdf(q.reshape(-1, q.shape[-1]), uniforms.reshape(-1)).view(uniforms.shape)
    # The top fan_out + 1 tokens hold fan_out that differ from the drawn one (the drawn token, if among them,
    # sorts last and is cut).
    ranked = q.topk(min(fan_out + 1, q.shape[-1]), -1).indices
    rank = torch.arange(ranked.shape[-1], device=q.device) + (ranked == drawn[..., None]) * ranked.shape[-1]
    rest = ranked.gather(-1, rank.argsort(-1)[..., : fan_out - 1])
    return torch.cat([drawn[..., None], rest], -1)


@dataclass
class StepContext:
    last_tokens: torch.Tensor  # [B] long; newest token, not yet fed to the target
    positions: torch.Tensor  # [B] long; position of last_tokens
    num_draft_tokens: int  # K for chains
    logits: LogitsPipeline
    generator: object  # None, a torch.Generator, or a list with one per row
    remaining: torch.Tensor | None = None  # [B] long; tokens each row still has to produce (>= 1)
    min_remaining: int | None = None  # on the host: a lower bound of `remaining` (None: unknown)
    # [B] long: each row's index among the call's requests (the decode call's input rows). With continuous
    # batching rows are admitted as others finish, so a drafter holding data per request looks it up here.
    requests: torch.Tensor | None = None


class Drafter:
    """Base class. A drafter that keeps per-row state must also implement `select_rows`."""

    def begin(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        """Called once with the (left-padded) prompt without its last token."""

    def propose(self, ctx: StepContext) -> Draft:
        raise NotImplementedError

    needs_hidden = False  # ask the verify pass for the target's last hidden state (trained heads)

    def commit(self, ctx: StepContext, acceptance: Acceptance, target_probs: torch.Tensor | None = None,
               output: ModelOutput | None = None) -> None:
        """Roll back to the accepted prefix; ctx is the context the draft was proposed in.

        target_probs [B, K+1, V]: the verify pass's processed distributions, for drafters that
        build their next draft from them (Jacobi decoding). output: the verify pass itself (its hidden
        states when `needs_hidden`).
        """

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows `rows` ([B'] long)."""

    def admit(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, ctx: StepContext) -> None:
        """Append rows for requests joining a running batch (continuous batching): their prompts without the
        last token, as in `begin`, and their own step context (last token, position, generators). A drafter
        that does not override this cannot take part in continuous batching."""
        raise NotImplementedError(f"{type(self).__name__} cannot admit rows into a running batch")


class DraftModelDrafter(Drafter):
    """A separate, smaller AR model drafts K tokens (chain) or a static tree of top-ranked tokens.

    Its KV cache follows the target's: after each step it is cropped to the
    accepted prefix, and the next proposal re-feeds the last accepted draft
    together with the new token, so every row feeds the same number of
    tokens even when acceptance is ragged.
    """

    def __init__(self, model: ARModel, tree: TreeSpec | None = None, dynamic: tuple[int, int, int] | None = None):
        if tree is not None and dynamic is not None:
            raise ValueError("give a static tree or a dynamic one (depth, top_k, total_tokens), not both")
        if dynamic is not None:
            check_dynamic_tree(*dynamic, owner="DraftModelDrafter")
        self.model = model
        self.tree = tree
        self.dynamic = dynamic  # EAGLE-2: (depth, top_k, total_tokens), a tree per row and step
        self.state: DecodeState | None = None
        self._carry: torch.Tensor | None = None  # [B] token at position-1 the draft cache lacks (-1: none)

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def begin(self, input_ids, attention_mask):
        self._carry = None
        self.state, _ = self.model.prefill(input_ids, attention_mask)

    def _feed_root(self, ctx: StepContext, tree: TreeSpec | None):
        last, pos = ctx.last_tokens[:, None], ctx.positions[:, None]
        root = torch.zeros(1, dtype=torch.long)
        token_mask = None
        if self._carry is None:
            tokens, positions, nodes = last, pos, (root if tree is not None else None)
        else:
            has_carry = self._carry >= 0  # rows admitted since the last step have nothing to carry
            tokens = torch.cat([self._carry.clamp(min=0)[:, None], last], 1)
            positions = torch.cat([pos - 1, pos], 1)
            nodes = torch.tensor([-1, 0]) if tree is not None else None
            token_mask = torch.stack([has_carry, torch.ones_like(has_carry)], 1)  # all True: as with no mask
        return self.model.forward(self.state, tokens, positions, tree=tree, tree_nodes=nodes,
                                  token_mask=token_mask).logits[:, -1]

    def propose(self, ctx):
        if self.tree is not None:
            return self._propose_tree(ctx)
        if self.dynamic is not None:
            return self._propose_dynamic(ctx)
        batch, k = ctx.last_tokens.shape[0], ctx.num_draft_tokens
        uniforms = None if ctx.logits.greedy else draw_uniform(ctx.generator, batch, k, ctx.last_tokens.device)
        logits = self._feed_root(ctx, None)
        tokens, probs = [], []
        for i in range(k):
            q = ctx.logits.probs(logits)
            tok = q.argmax(-1) if ctx.logits.greedy else sample_inverse_cdf(q, uniforms[:, i])
            tokens.append(tok)
            probs.append(q)
            if i + 1 < k:
                logits = self.model.forward(self.state, tok[:, None], (ctx.positions + 1 + i)[:, None]).logits[:, -1]
        return Draft(tokens=torch.stack(tokens, 1), probs=None if ctx.logits.greedy else torch.stack(probs, 1),
                     forwards=k)

    def _propose_tree(self, ctx):
        """Children of a node are its draft distribution's top-ranked tokens (deterministic proposals); one
        draft forward per tree level over the level's nodes that have children, the tree's shape read from
        host-side tables (no device reads)."""
        tree = self.tree
        batch, device = ctx.last_tokens.shape[0], ctx.last_tokens.device
        fan_out = tree.child_table.shape[1]  # the most children any node has: the top-k each node needs
        node_tokens = torch.full((batch, tree.num_nodes + 1), -1, dtype=torch.long, device=device)
        node_tokens[:, 0] = ctx.last_tokens
        top = torch.zeros(batch, tree.num_nodes + 1, fan_out, dtype=torch.long, device=device)
        top[:, 0] = ctx.logits.process(self._feed_root(ctx, tree)).topk(fan_out, -1).indices
        forwards = 1
        for d in range(1, tree.max_depth + 1):
            index = tree.level_index(d, device)
            node_tokens[:, index.nodes] = top[:, index.parents, index.ranks]
            if d == tree.max_depth:
                break
            grow = index.expanding  # the draft model runs only on nodes that have children
            positions = (ctx.positions[:, None] + d).expand(-1, grow.numel())
            out = self.model.forward(self.state, node_tokens[:, grow], positions, tree=tree, tree_nodes=grow)
            forwards += 1
            top[:, grow] = ctx.logits.process(out.logits).topk(fan_out, -1).indices
        return Draft(tokens=node_tokens[:, 1:], probs=None, tree=tree, forwards=forwards)

    def _propose_dynamic(self, ctx):
        """EAGLE-2 trees from the draft model's confidence (`DynamicTreeBuilder`): one draft forward per level
        for the whole frontier, then the `total_tokens` most confident nodes."""
        depth, top_k, total = self.dynamic
        build = DynamicTreeBuilder(ctx.last_tokens.shape[0], depth, top_k, total, ctx.last_tokens.device)

        def log_probs(logits):
            return torch.log_softmax(ctx.logits.process(logits).float(), -1)

        frontier = build.root(log_probs(self._feed_root(ctx, build.fed_tree)))
        forwards = 1
        for level in range(1, depth):
            positions = (ctx.positions[:, None] + level).expand(-1, top_k)
            out = self.model.forward(self.state, frontier, positions, tree=build.fed_tree,
                                     tree_nodes=build.fed_tree.level_nodes(level))
            forwards += 1
            frontier, _ = build.expand(log_probs(out.logits), level)
        tokens, tree = build.finish()
        self._proposed = tree
        return Draft(tokens=tokens, probs=None, tree=tree, forwards=forwards)

    def commit(self, ctx, acceptance, target_probs=None, output=None):
        num = acceptance.num_accepted
        if self.dynamic is not None:
            # The accepted path as nodes this drafter fed: every one but the deepest was a frontier node (only
            # frontiers are expanded), and the deepest is re-fed next step anyway (see `_carry`).
            path = acceptance.path_nodes
            fed = self._proposed.fed_ids.gather(1, path.clamp(min=0))
            self.model.keep(self.state, torch.where(path >= 0, fed, -1))
        elif self.tree is not None:
            self.model.keep(self.state, acceptance.path_nodes)
        # Keep positions < position+num; the token at position+num is re-fed next step with the new one.
        self.model.crop(self.state, ctx.positions + num)
        accepted_prev = acceptance.tokens.gather(1, (num - 1).clamp(min=0)[:, None]).squeeze(1)
        self._carry = torch.where(num > 0, accepted_prev, ctx.last_tokens)

    def select_rows(self, rows):
        self.model.select_rows(self.state, rows)
        if self._carry is not None:
            self._carry = self._carry[rows]

    def admit(self, input_ids, attention_mask, ctx):
        new_state, _ = self.model.prefill(input_ids, attention_mask)
        self.model.append_rows(self.state, new_state)
        if self._carry is not None:
            self._carry = torch.cat([self._carry, torch.full_like(ctx.last_tokens, -1)])
