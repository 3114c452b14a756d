"""The EAGLE drafter (Li et al., arXiv:2401.15077) as LANTERN uses it: one decoder layer on the target's features.

The target's last hidden state f_i at position i is the state its output layer turns into the distribution
of token i+1. The head reads, at its own position i, the pair (embedding of token i+1, f_i), fused by
`fc(2H→H)`, runs one transformer layer over all earlier pairs and predicts f_{i+1}; the *target's* output
layer turns that prediction into the draft distribution of token i+2. Drafting is autoregressive in feature
space: the predicted feature and the drafted token form the next pair. The target's embedding and output
layer are frozen and not part of the checkpoint; a head is bound to a target adapter through
`ARModel.token_embeddings()` and `ARModel.output_logits()`.

With classifier-free guidance the head runs on the conditional and the unconditional features (2B rows,
the same tokens) and its logits are combined as the target's, u + s·(c − u), before the logits pipeline.

Prompt tokens are not fed to the head: its context starts at the first position the target verified with
drafts (the last prompt token). For class-conditional image models (one prompt token) that is everything;
for long text prompts the target's features still carry the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from mmspec.common.accept import Acceptance, Draft
from mmspec.common.draft import Drafter, StepContext, sampled_first_children
from mmspec.common.dynamic_tree import DynamicTreeBuilder, check_dynamic_tree
from mmspec.common.kernels import sample_inverse_cdf
from mmspec.common.layers import TransformerBlock, find_multiple
from mmspec.common.logits import draw_uniform
from mmspec.common.model import ARModel, CFGModel, DecodeState, cfg_combine
from mmspec.common.slots import SlotTable, additive_mask
from mmspec.common.tree import TreeSpec

BUNDLED_EAGLE_HEAD = Path(__file__).resolve().parent / "bundled" / "eagle_head"  # trained on llamagen-tiny


def rope_1d(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, L, head_dim/2] of plain 1-D rotary embeddings at integer positions [B, L]."""
    half = head_dim // 2
    freqs = base ** (-torch.arange(half, dtype=torch.float64, device=positions.device) / half)
    angles = positions.double()[..., None] * freqs
    return angles.cos().float(), angles.sin().float()


class EagleHead(ModelMixin, ConfigMixin):
    """fc(2H→H) + one pre-norm transformer layer (`mmspec.common.layers`: RMSNorm, SwiGLU; 1-D RoPE over
    absolute positions), the layer of the LlamaGen-style targets it was trained with."""

    @register_to_config
    def __init__(self, hidden_size: int = 256, num_heads: int = 4, vocab_size: int = 512,
                 rope_base: float = 10000.0, norm_eps: float = 1e-5):
        super().__init__()
        if hidden_size % num_heads or (hidden_size // num_heads) % 2:
            raise ValueError(f"hidden_size / num_heads must be an even integer, got {hidden_size}/{num_heads}")
        self.fc = nn.Linear(2 * hidden_size, hidden_size, bias=True)
        self.layer = TransformerBlock(hidden_size, num_heads, num_heads, find_multiple(int(8 * hidden_size / 3), 64),
                                      norm_eps)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
        nn.init.zeros_(self.fc.bias)

    @classmethod
    def for_target(cls, target: ARModel, num_heads: int | None = None) -> "EagleHead":
        """An untrained head sized for an adapter (any that exposes its token embeddings)."""
        hidden = target.token_embeddings().shape[1]
        heads = num_heads or next(h for h in (8, 4, 2, 1) if hidden % h == 0 and (hidden // h) % 2 == 0)
        return cls(hidden_size=hidden, num_heads=heads, vocab_size=target.vocab_size)

    def forward(self, features: torch.Tensor, token_embeds: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor | None = None, cache: list | None = None) -> torch.Tensor:
        """features, token_embeds [B, L, H]; positions [B, L]; mask additive [B, 1, L, S+L] (None: causal).
        Returns the predicted next features [B, L, H]."""
        dtype = self.fc.weight.dtype
        x = self.fc(torch.cat([token_embeds.to(dtype), features.to(dtype)], -1))
        cos, sin = rope_1d(positions, self.config.hidden_size // self.config.num_heads, self.config.rope_base)
        return self.layer(x, cos, sin, mask, cache)


class BoundHead(ARModel):
    """An EagleHead bound to a target adapter: its frozen embeddings and output layer, plus a KV cache per
    row kept like any adapter's (`crop`, `keep`, `select_rows` and compaction come from ARModel). It is fed
    (token, feature) pairs through `run`, not `forward`."""

    def __init__(self, head: EagleHead, target: ARModel):
        base = target.base if isinstance(target, CFGModel) else target
        if head.config.vocab_size != target.vocab_size:
            raise ValueError(f"the EAGLE head's vocabulary ({head.config.vocab_size}) does not match the "
                             f"target's ({target.vocab_size})")
        with torch.no_grad():
            embeddings = target.token_embeddings().detach()
        if embeddings.shape[1] != head.config.hidden_size:
            raise ValueError(f"the EAGLE head's hidden size ({head.config.hidden_size}) does not match the "
                             f"target's ({embeddings.shape[1]})")
        self.head, self.target = head, base
        # Row vocab_size is all zeros: prompt tokens (ids >= vocab_size) carry no code embedding.
        self.embeddings = torch.cat([embeddings, embeddings.new_zeros(1, embeddings.shape[1])])
        self.vocab_size = target.vocab_size
        self.device = next(head.parameters()).device

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embeddings.to(tokens.device)[tokens.clamp(min=0, max=self.vocab_size)]

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.target.output_logits(features.to(self.embeddings.dtype))

    def new_state(self, batch_size: int) -> DecodeState:
        return DecodeState(cache=[None, None], slots=SlotTable.empty(batch_size, self.device))

    def _map_kv(self, state: DecodeState, fn) -> None:
        if state.cache[0] is not None:
            state.cache[0], state.cache[1] = fn(state.cache[0]), fn(state.cache[1])

    def run(self, state: DecodeState, tokens, features, positions, *, token_mask=None, tree: TreeSpec | None = None,
            tree_nodes=None, query_only=None) -> torch.Tensor:
        """ARModel.forward with the target features as a second input; returns the predicted features."""
        mask = state.slots.attention_mask(positions, token_mask, tree_nodes, tree, query_only)
        out = self.head(features, self.embed(tokens), positions,
                        additive_mask(mask, self.head.fc.weight.dtype), state.cache)
        state.slots.append(positions, token_mask, tree_nodes, tree, query_only)
        return out

    def drop_tree(self, state: DecodeState) -> None:
        """Resolve a pending tree block by keeping none of its nodes."""
        if state.slots.tree is not None:
            self.keep(state, torch.full((state.slots.batch_size, 1), -1, dtype=torch.long, device=self.device))


@dataclass
class _Verified:
    """Target features of the last verify pass along the accepted path, not yet fed to the head."""
    features: torch.Tensor  # [R, n, H]; R = B (or 2B with CFG: cond rows then uncond rows), right-aligned
    tokens: torch.Tensor  # [B, n] the token that follows each feature's position
    positions: torch.Tensor  # [B, n] head position of each pair; -1 marks left padding
    query_only: torch.Tensor | None = None  # [B, n] bool; True: a row's bootstrap pair (admitted mid-batch)


class EagleDrafter(Drafter):
    """Chain or static-tree drafts from an EagleHead, for the target it is bound to.

    Chains are sampled from the head's processed distribution (greedy: its argmax) and come with those
    distributions for speculative sampling. Tree children are the head's top-ranked tokens at their parent
    (deterministic proposals, verified by multi-candidate rejection); with `sampled_children` and sampling,
    a static tree's first child at each node is drawn from the head's distribution instead (and the rest are
    the top-ranked others), which a flat target keeps far more often. Dynamic trees rank by confidence: their
    children stay deterministic.
    """

    needs_hidden = True

    def __init__(self, head: EagleHead, target: ARModel, tree: TreeSpec | None = None,
                 dynamic: tuple[int, int, int] | None = None, sampled_children: bool = False):
        if tree is not None and dynamic is not None:
            raise ValueError("give a static tree or a dynamic one (depth, top_k, total_tokens), not both")
        if dynamic is not None:
            check_dynamic_tree(*dynamic, owner="EagleDrafter")
        self.bound = BoundHead(head, target)
        self.tree = tree
        self.dynamic = dynamic  # EAGLE-2: (depth, top_k, total_tokens), a tree per row and step
        self.sampled_children = sampled_children
        self.guidance_scale = target.guidance_scale if isinstance(target, CFGModel) else None
        self.vocab_size = target.vocab_size
        self.state: DecodeState | None = None
        self.verified: _Verified | None = None

    # -- helpers ---------------------------------------------------------
    @property
    def _halves(self) -> int:
        return 1 if self.guidance_scale is None else 2

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        """Repeat a [B, ...] tensor for the head's rows (cond and uncond under CFG)."""
        return t if self._halves == 1 else torch.cat([t, t], 0)

    def _draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """[R, L, H] head features -> [B, L, V] logits, CFG-combined."""
        logits = self.bound.logits(features)
        if self._halves == 1:
            return logits
        cond, uncond = logits.chunk(2, 0)
        return cfg_combine(cond, uncond, self.guidance_scale)

    def _feed_verified(self, ctx: StepContext) -> torch.Tensor:
        """Feed what the target verified since the last draft; returns the root feature [R, 1, H], the head's
        prediction of the target feature at ctx.positions (whose output layer gives token positions+1)."""
        b = ctx.last_tokens.shape[0]
        if self.verified is None:
            # First step: no target feature yet. Bootstrap from a zero feature at the position before the
            # newest token, fed query-only so it never enters the head's context.
            hidden = self.bound.head.config.hidden_size
            zeros = torch.zeros(self._halves * b, 1, hidden, device=ctx.last_tokens.device)
            pos = (ctx.positions - 1).clamp(min=0)[:, None]
            return self.bound.run(self.state, self._rows(ctx.last_tokens[:, None]), zeros, self._rows(pos),
                                  query_only=torch.ones(self._halves * b, 1, dtype=torch.bool,
                                                        device=zeros.device))
        v = self.verified
        valid = v.positions >= 0
        out = self.bound.run(self.state, self._rows(v.tokens), v.features, self._rows(v.positions.clamp(min=0)),
                             token_mask=self._rows(valid),
                             query_only=None if v.query_only is None else self._rows(v.query_only))
        return out[:, -1:]

    # -- the Drafter protocol ----------------------------------------------
    def begin(self, input_ids, attention_mask):
        self.state, self.verified = None, None

    @torch.no_grad()
    def propose(self, ctx: StepContext) -> Draft:
        b, device = ctx.last_tokens.shape[0], ctx.last_tokens.device
        if self.state is None:
            self.state = self.bound.new_state(self._halves * b)
        root = self._feed_verified(ctx)
        if self.tree is not None:
            return self._propose_tree(ctx, root)
        if self.dynamic is not None:
            return self._propose_dynamic(ctx, root)
        k = ctx.num_draft_tokens
        uniforms = None if ctx.logits.greedy else draw_uniform(ctx.generator, b, k, device)
        feature, tokens, probs = root, [], []
        for i in range(k):
            q = ctx.logits.probs(self._draft_logits(feature)[:, 0])
            tok = q.argmax(-1) if ctx.logits.greedy else sample_inverse_cdf(q, uniforms[:, i])
            tokens.append(tok)
            probs.append(q)
            if i + 1 < k:
                pos = (ctx.positions + i)[:, None]
                feature = self.bound.run(self.state, self._rows(tok[:, None]), feature, self._rows(pos))
        return Draft(tokens=torch.stack(tokens, 1), probs=None if ctx.logits.greedy else torch.stack(probs, 1),
                     forwards=k)

    def _propose_tree(self, ctx: StepContext, root: torch.Tensor) -> Draft:
        """One head forward per tree level (all of the level's nodes that have children, at once); a node's
        children are its draft
        distribution's top-ranked tokens, or with `sampled_children` under sampling a token drawn from it first
        and then the top-ranked others. The tree's shape is read from host-side tables: no device reads."""
        tree, b = self.tree, ctx.last_tokens.shape[0]
        device = ctx.last_tokens.device
        sample = self.sampled_children and not ctx.logits.greedy
        fan_out = tree.child_table.shape[1]  # the most children any node has: the top-k each node needs
        node_tokens = torch.full((b, tree.num_nodes + 1), -1, dtype=torch.long, device=device)
        node_tokens[:, 0] = ctx.last_tokens
        features = root.new_zeros(root.shape[0], tree.num_nodes + 1, root.shape[-1])  # 2B rows with guidance
        features[:, 0] = root[:, 0]
        top = torch.zeros(b, tree.num_nodes + 1, fan_out, dtype=torch.long, device=device)
        uniforms = draw_uniform(ctx.generator, b, tree.num_nodes + 1, device) if sample else None
        node_probs = None
        if sample:
            node_probs = torch.zeros(b, tree.num_nodes + 1, self.vocab_size, device=device)

        def children(logits: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
            """[b, L, V] head logits at `nodes` [L] -> their children's tokens [b, L, fan_out], by rank."""
            if not sample:
                return ctx.logits.process(logits).topk(fan_out, -1).indices
            q = ctx.logits.probs(logits)
            node_probs[:, nodes] = q
            return sampled_first_children(q, uniforms[:, nodes], fan_out)

        top[:, :1] = children(self._draft_logits(root)[:, :1], torch.tensor([0], device=device))
        forwards = 1
        for d in range(1, tree.max_depth + 1):
            index = tree.level_index(d, device)
            node_tokens[:, index.nodes] = top[:, index.parents, index.ranks]
            if d == tree.max_depth:
                break
            grow = index.expanding  # the head runs only on nodes that have children
            pos = (ctx.positions[:, None] + d - 1).expand(-1, grow.numel())
            out = self.bound.run(self.state, self._rows(node_tokens[:, grow]), features[:, index.expanding_parents],
                                 self._rows(pos), tree=tree, tree_nodes=grow)
            forwards += 1
            features[:, grow] = out.to(features.dtype)
            top[:, grow] = children(self._draft_logits(out), grow)
        return Draft(tokens=node_tokens[:, 1:], probs=node_probs, tree=tree, forwards=forwards)

    def _propose_dynamic(self, ctx: StepContext, root: torch.Tensor) -> Draft:
        """EAGLE-2: grow each row's tree from the head's confidence (`DynamicTreeBuilder`), one head forward per
        level for the whole frontier, then keep the `total_tokens` most confident nodes."""
        depth, top_k, total = self.dynamic
        build = DynamicTreeBuilder(ctx.last_tokens.shape[0], depth, top_k, total, ctx.last_tokens.device)

        def log_probs(features):
            return torch.log_softmax(ctx.logits.process(self._draft_logits(features)).float(), -1)

        frontier = build.root(log_probs(root)[:, 0])
        parent_features = root.expand(-1, top_k, -1)
        forwards = 1
        for level in range(1, depth):
            positions = (ctx.positions[:, None] + level - 1).expand(-1, top_k)
            out = self.bound.run(self.state, self._rows(frontier), parent_features, self._rows(positions),
                                 tree=build.fed_tree, tree_nodes=build.fed_tree.level_nodes(level))
            forwards += 1
            frontier, parent = build.expand(log_probs(out), level)
            parent_features = out.gather(1, self._rows(parent)[..., None].expand(-1, -1, out.shape[-1]))
        tokens, tree = build.finish()
        return Draft(tokens=tokens, probs=None, tree=tree, forwards=forwards)

    def commit(self, ctx: StepContext, acceptance: Acceptance, target_probs=None, output=None):
        if output is None or output.hidden is None:
            raise ValueError("EagleDrafter needs the verify pass's hidden states")
        # Everything the head fed at or after the newest verified position was speculative.
        self.bound.drop_tree(self.state)
        self.bound.crop(self.state, self._rows(ctx.positions))
        num = acceptance.num_accepted
        b = num.shape[0]
        n = (int(num.max()) if acceptance.max_accepted is None else acceptance.max_accepted) + 1
        device = num.device
        if acceptance.path_nodes is not None:
            nodes = acceptance.path_nodes[:, :n]
        else:
            nodes = torch.arange(n, device=device).expand(b, n)
        # Right-align each row's kept pairs so the last column is every row's newest feature.
        shift = (n - 1 - num)[:, None]
        src = (torch.arange(n, device=device)[None] - shift)
        valid = src >= 0
        src = src.clamp(min=0)
        node_idx = nodes.gather(1, src).clamp(min=0)
        halves = [output.hidden] + ([output.uncond_hidden] if self._halves == 2 else [])
        feats = torch.cat([h.gather(1, node_idx[..., None].to(h.device).expand(-1, -1, h.shape[-1]))
                           for h in halves], 0)
        tokens = acceptance.tokens[:, :n].gather(1, src)
        positions = torch.where(valid, ctx.positions[:, None] + src, -1)
        self.verified = _Verified(feats.float(), tokens, positions)

    def select_rows(self, rows):
        batch = self.verified.tokens.shape[0]
        both = rows if self._halves == 1 else torch.cat([rows, rows + batch])
        self.bound.select_rows(self.state, both)
        v = self.verified
        self.verified = _Verified(v.features[both], v.tokens[rows], v.positions[rows],
                                  None if v.query_only is None else v.query_only[rows])

    def admit(self, input_ids, attention_mask, ctx):
        """New rows start as a first step does: an empty head cache and the bootstrap pair (the newest token
        with a zero feature, query-only), fed with the running rows' verified pairs at the next proposal."""
        v, new = self.verified, ctx.last_tokens.shape[0]
        old, width = v.tokens.shape
        device = v.tokens.device
        self.bound.append_rows(self.state, self.bound.new_state(self._halves * new))
        if self._halves == 2:  # [cond_old; uncond_old; cond_new; uncond_new] -> [cond; uncond]
            order = torch.cat([torch.arange(old), 2 * old + torch.arange(new), old + torch.arange(old),
                               2 * old + new + torch.arange(new)]).to(device)
            self.bound.select_rows(self.state, order)
        tokens = torch.zeros(new, width, dtype=torch.long, device=device)
        tokens[:, -1] = ctx.last_tokens.to(device)
        positions = torch.full((new, width), -1, dtype=torch.long, device=device)
        positions[:, -1] = (ctx.positions.to(device) - 1).clamp(min=0)
        query_only = torch.zeros(old + new, width, dtype=torch.bool, device=device)
        if v.query_only is not None:
            query_only[:old] = v.query_only
        query_only[old:, -1] = True
        zeros = v.features.new_zeros(new, width, v.features.shape[-1])
        halves = v.features.chunk(self._halves, 0)
        features = torch.cat([part for half in halves for part in (half, zeros)])
        self.verified = _Verified(features, torch.cat([v.tokens, tokens]), torch.cat([v.positions, positions]),
                                  query_only)


def load_bundled_head(device="cpu") -> EagleHead:
    return EagleHead.from_pretrained(BUNDLED_EAGLE_HEAD).to(device).eval()
