"""Drafting residual codes from a depth decoder's own state: frozen heads of later levels on h + offset.

The depth decoder's state h_q at position q is what its head q turns into the distribution of code level q.
Heads of the *later* levels q+1, q+2, … applied to the same state already guess those levels (head-ahead
drafting, TensorRT-Edge-LLM's training-free CodePredictor speculation); a learned offset vector o_d per draft
distance d moves the state towards where level q+d's head expects it (RVQ position-aware speculation):

    q_d = process(head[q+d](h_q + o_d))            d = 1 … D

Nothing else is trained: the offsets are D·H numbers (or one set per source level), the heads stay frozen.
The drafts of one step do not depend on each other, so a chain costs D head matmuls and no network forward,
and a static tree takes the top-ranked codes of each q_d (the same codes under every parent).

The first call of a frame runs [backbone state, code 0] (the deferred prompt) and has no state to draft
from yet; it yields code 1, and drafting starts from its state. So a frame of K levels has K−2 codes to
draft, and the draft length D is at most K−2.
"""

from __future__ import annotations

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from mmspec.common.accept import Acceptance, Draft
from mmspec.common.draft import Drafter, StepContext
from mmspec.common.kernels import sample_inverse_cdf
from mmspec.common.logits import draw_ragged_uniforms
from mmspec.common.tree import TreeSpec


class RVQOffsets(ModelMixin, ConfigMixin):
    """The learned offset vectors: `offsets[source, d − 1]` [H] is added to the state at level `source` before
    level source+d's head drafts from it. `per_level=False` shares one set across source levels (the paper's
    3 × 1024 parameters for Qwen3-TTS); `per_level=True` keeps one set per source level."""

    @register_to_config
    def __init__(self, hidden_size: int = 256, num_codebooks: int = 8, per_level: bool = False):
        super().__init__()
        if num_codebooks < 3:
            raise ValueError(f"RVQ speculation needs at least 3 code levels per frame, got num_codebooks={num_codebooks}")
        self.max_distance = num_codebooks - 2
        sources = num_codebooks - 1 if per_level else 1
        self.offsets = torch.nn.Parameter(torch.zeros(sources, self.max_distance, hidden_size))

    def vectors(self, source_levels: torch.Tensor, distances: torch.Tensor) -> torch.Tensor:
        """source_levels, distances: [N] long (levels 1 … K−2, distances 1 … K−2) -> [N, H] offsets."""
        source = source_levels.clamp(0, self.offsets.shape[0] - 1) if self.config.per_level else \
            torch.zeros_like(source_levels)
        return self.offsets[source, (distances - 1).clamp(0, self.max_distance - 1)]

    def check_fits(self, num_codebooks: int, hidden_size: int | None, where: str) -> None:
        """A clear error when these offsets were trained for a depth decoder of another shape."""
        if self.config.num_codebooks != num_codebooks or (hidden_size is not None
                                                           and self.config.hidden_size != hidden_size):
            raise ValueError(f"{where} were trained for a depth decoder of {self.config.num_codebooks} code levels "
                             f"and hidden size {self.config.hidden_size}; this one has {num_codebooks} levels and "
                             f"hidden size {hidden_size}: train offsets for it (examples/train_rvq_offsets.py) "
                             "or use offsets='none'")


class OffsetDrafter(Drafter):
    """Chain (or static-tree) drafts of the next levels from the newest verified depth-decoder state.

    target: an `RVQDepthModel` (its `code_logits` are the frozen per-level heads). offsets: `RVQOffsets`,
    or None for head-ahead drafting. num_draft_tokens: chain length D (each row drafts at most the codes its
    frame has left after the next call). Chains come with their processed draft distributions (speculative
    sampling); tree children are deterministic top-ranked codes (multi-candidate rejection)."""

    needs_hidden = True

    def __init__(self, target, offsets: RVQOffsets | None, num_draft_tokens: int = 0, tree: TreeSpec | None = None):
        self.target = target
        self.offsets = offsets
        self.num_draft_tokens = num_draft_tokens
        self.tree = tree
        self.vocab_size = target.vocab_size
        self.state_hidden: torch.Tensor | None = None  # [B, H] newest verified state per row

    def begin(self, input_ids, attention_mask):
        self.state_hidden = None

    def _draft_logits(self, ctx: StepContext, depth: int) -> torch.Tensor:
        """[B, depth, V] raw logits of levels P … P+depth−1 drafted from the state at level P−1 (P = position
        of the newest token)."""
        hidden = self.state_hidden
        batch = hidden.shape[0]
        device = hidden.device
        distance = torch.arange(1, depth + 1, device=device).expand(batch, depth)  # [B, D]
        source = (ctx.positions.to(device) - 1)[:, None].expand(batch, depth)  # the state's own level
        levels = (source + distance).clamp(max=self.target.num_codebooks - 1)
        states = hidden[:, None, :].expand(batch, depth, -1)
        if self.offsets is not None:
            shift = self.offsets.vectors(source.reshape(-1), distance.reshape(-1)).view(batch, depth, -1)
            states = states + shift.to(states.dtype)
        logits = self.target.code_logits(states.reshape(batch * depth, -1), levels.reshape(-1))
        return logits.view(batch, depth, -1)

    @torch.no_grad()
    def propose(self, ctx: StepContext) -> Draft:
        batch, device = ctx.last_tokens.shape[0], ctx.last_tokens.device
        # Each row drafts what its frame has left after the next call's own code, at most D.
        lengths = (ctx.remaining.to(device) - 1).clamp(0, self.num_draft_tokens)
        depth = int(lengths.max())
        if self.state_hidden is None or depth == 0:  # the frame's first call (nothing verified to draft from
            # yet), or every row is one code from the end of its frame
            empty = torch.empty(batch, 0, dtype=torch.long, device=device)
            probs = None if ctx.logits.greedy else torch.empty(batch, 0, self.vocab_size, device=device)
            return Draft(tokens=empty, probs=probs)
        if self.tree is not None:
            return self._propose_tree(ctx)
        probs = ctx.logits.probs(self._draft_logits(ctx, depth))  # [B, D, V]
        if ctx.logits.greedy:
            tokens = probs.argmax(-1)
        else:
            uniforms = draw_ragged_uniforms(ctx.generator, lengths, depth, device)
            tokens = sample_inverse_cdf(probs.reshape(batch * depth, -1), uniforms.reshape(-1)).view(batch, depth)
        tokens = tokens.masked_fill(torch.arange(depth, device=device)[None] >= lengths[:, None], 0)
        return Draft(tokens=tokens, probs=None if ctx.logits.greedy else probs, lengths=lengths)

    def _propose_tree(self, ctx: StepContext) -> Draft:
        tree = self.tree
        depth = tree.max_depth
        widest = int(tree.rank.max()) + 1
        ranked = ctx.logits.process(self._draft_logits(ctx, depth)).topk(widest, dim=-1).indices  # [B, D, R]
        node_depth = tree.depth[1:].to(ranked.device) - 1
        node_rank = tree.rank[1:].to(ranked.device)
        return Draft(tokens=ranked[:, node_depth, node_rank], probs=None, tree=tree)

    def commit(self, ctx, acceptance: Acceptance, target_probs=None, output=None):
        if output is None or output.hidden is None:
            raise ValueError("OffsetDrafter needs the verify pass's hidden states")
        num = acceptance.num_accepted
        # The column whose output gave the extra token: the last kept draft (or the root).
        column = num if acceptance.path_nodes is None else acceptance.path_nodes.gather(1, num[:, None])[:, 0]
        rows = torch.arange(num.shape[0], device=output.hidden.device)
        self.state_hidden = output.hidden[rows, column.to(rows.device)]

    def select_rows(self, rows):
        if self.state_hidden is not None:
            self.state_hidden = self.state_hidden[rows.to(self.state_hidden.device)]
