"""`ssd`: spatially speculative decoding with two trained heads (after SSD, arXiv:2606.20543).

An image token is predictable from its spatial neighbours, and in raster order
the row above is always complete. Two small heads on the target's last hidden
state h_t (the state that predicts token t+1) are trained by self-distillation:

- the **right** head predicts token t+2, the right neighbour of the next token;
- the **below** head predicts token t+W, the token one image row under t.

A draft of K tokens for positions g+1 … g+K (g = the newest token) costs no
forward of its own: position g+1 comes from the right head on h_{g−1}, and
every later position g+i from the below head on the hidden state of the token
above it, h_{g+i−W}, which the target computed when that row was verified.
The target verifies the chain in one forward with the core's rules (greedy
match, or speculative sampling against the heads' processed distributions), so
the output is exactly plain AR's. With CFG both heads are applied to the
conditional and the unconditional hidden states and combined like the
target's logits. Where no source state exists (the first row, the first step)
the draft comes from the code prior (marginal code frequencies of the training
data).

No public code exists; the head targets (t+2 and t+W) and the split of the
chain between the heads are this project's reading of "predict the right and
the below neighbour from the current hidden state".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from mmspec.common.accept import Acceptance, Draft, GreedyMatch, SpeculativeSampling
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.heads import load_head
from mmspec.common.draft import Drafter, StepContext, sampled_first_children
from mmspec.common.kernels import sample_inverse_cdf
from mmspec.common.logits import draw_uniform
from mmspec.common.model import CFGModel, cfg_combine
from mmspec.common.plugin import Plugin
from mmspec.common.registry import register_plugin
from mmspec.common.structure import CodeGrid
from mmspec.common.tree import TreeSpec, parse_branching

from .config import SSDConfig

BUNDLED_HEADS = Path(__file__).resolve().parent / "bundled" / "ssd_heads"  # trained on llamagen-tiny


class _Head(nn.Module):
    """Medusa-style: one residual SiLU block, then a projection to the codebook."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.block = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)
        nn.init.zeros_(self.block.weight)
        nn.init.zeros_(self.block.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(h + nn.functional.silu(self.block(h)))


class SpatialHeads(ModelMixin, ConfigMixin):
    """The right and below heads plus the code prior; saved and loaded like any diffusers model."""

    @register_to_config
    def __init__(self, hidden_size: int = 256, vocab_size: int = 512, grid_width: int = 16):
        super().__init__()
        self.right = _Head(hidden_size, vocab_size)
        self.below = _Head(hidden_size, vocab_size)
        self.register_buffer("prior_logits", torch.zeros(vocab_size))

    def init_from_lm_head(self, weight: torch.Tensor) -> None:
        """Start both projections from the target's output layer (the heads then learn a correction)."""
        with torch.no_grad():
            self.right.out.weight.copy_(weight)
            self.below.out.weight.copy_(weight)


@dataclass
class _Hidden:
    cond: torch.Tensor  # [B, N+1, H]; slot j+1 holds the state at generated token j (slot 0: last prompt token)
    uncond: torch.Tensor | None  # same for the unconditional rows under CFG
    known: torch.Tensor  # [B, N+1] bool


class SpatialDrafter(Drafter):
    needs_hidden = True

    def __init__(self, heads: SpatialHeads, grid: tuple[int, int], guidance_scale: float | None,
                 tree: TreeSpec | None = None, sampled_children: bool = False):
        self.heads = heads
        self.tree = tree
        self.sampled_children = sampled_children
        if tree is not None:  # node n (numbered level by level from 1) drafts position depth(n) − 1's
            # candidate of rank rank(n)
            nodes = [n for level in tree.levels[1:] for n in level]
            if nodes != list(range(1, tree.num_nodes + 1)):
                raise ValueError("the tree must number its nodes level by level (TreeSpec does)")
            self._node_candidate = (torch.tensor([d for d, level in enumerate(tree.levels[1:]) for _ in level]),
                                    torch.tensor([tree.ranks[n] for n in nodes]))
            # Sampled children: node n's children draw from position depth(n)'s distribution (leaves: unused).
            self._children_position = torch.tensor([min(len(p), tree.max_depth - 1) for p in ((),) + tree.paths])
            self._parents = torch.tensor(tree.parents[1:])
        self.height, self.width = grid
        self.guidance_scale = guidance_scale
        self.vocab_size = heads.config.vocab_size
        self.store: _Hidden | None = None
        self.start: torch.Tensor | None = None  # [B] position of generated token 0

    def begin(self, input_ids, attention_mask):
        self.store = self.start = None

    def _head_logits(self, head: nn.Module, slots: torch.Tensor) -> torch.Tensor:
        """Head logits [B, K, V] on stored states at slots [B, K] (CFG-combined), prior where unknown."""
        idx = slots.clamp(min=0)
        gather = lambda t: t.gather(1, idx[..., None].expand(-1, -1, t.shape[-1]))  # noqa: E731
        dtype = next(self.heads.parameters()).dtype
        logits = head(gather(self.store.cond).to(dtype)).float()
        if self.guidance_scale is not None and self.store.uncond is not None:
            uncond = head(gather(self.store.uncond).to(dtype)).float()
            logits = cfg_combine(logits, uncond, self.guidance_scale)
        ok = (slots >= 0) & self.store.known.gather(1, idx)
        return torch.where(ok[..., None], logits, self.heads.prior_logits.float())

    @torch.no_grad()
    def propose(self, ctx: StepContext) -> Draft:
        batch, device = ctx.last_tokens.shape[0], ctx.last_tokens.device
        k = ctx.num_draft_tokens if self.tree is None else self.tree.max_depth
        if self.store is None:
            n, hidden = self.height * self.width, self.heads.config.hidden_size
            zeros = torch.zeros(batch, n + 1, hidden, device=device)
            self.store = _Hidden(zeros, zeros.clone() if self.guidance_scale is not None else None,
                                 torch.zeros(batch, n + 1, dtype=torch.bool, device=device))
            self.start = ctx.positions + 1
        newest = ctx.positions - self.start  # generated index of ctx.last_tokens (-1: the prompt's last token)
        offsets = torch.arange(1, k + 1, device=device)[None]
        # Slot of the source state: right head -> token g−1 (slot g); below head -> token g+i−W (slot g+i−W+1).
        right_slot = newest[:, None]
        below_slots = newest[:, None] + offsets - self.width + 1
        logits = torch.cat([self._head_logits(self.heads.right, right_slot),
                            self._head_logits(self.heads.below, below_slots[:, 1:])], 1)
        if self.tree is not None:
            tree, fan_out = self.tree, self.tree.child_table.shape[1]
            position, rank = (t.to(device) for t in self._node_candidate)
            if ctx.logits.greedy or not self.sampled_children:
                # Node n at depth d takes position d's candidate of its rank: the same under every parent.
                top = ctx.logits.process(logits).topk(fan_out, -1).indices  # [B, depth, fan-out]
                return Draft(tokens=top[:, position, rank], probs=None, tree=tree, forwards=0)
            # Each node's first child is its own draw from the distribution of the position below it (kept with
            # min(1, p/q) like a chain's draft), its siblings that distribution's top-ranked other tokens.
            node_q = ctx.logits.probs(logits)[:, self._children_position.to(device)]  # [B, N+1, V]
            uniforms = draw_uniform(ctx.generator, batch, tree.num_nodes + 1, device)
            children = sampled_first_children(node_q, uniforms, fan_out)  # [B, N+1, fan-out]
            return Draft(tokens=children[:, self._parents.to(device), rank], probs=node_q, tree=tree, forwards=0)
        probs = ctx.logits.probs(logits)
        if ctx.logits.greedy:
            tokens = probs.argmax(-1)
        else:
            tokens = sample_inverse_cdf(probs, draw_uniform(ctx.generator, batch, k, device))
        return Draft(tokens=tokens, probs=None if ctx.logits.greedy else probs, forwards=0)

    def commit(self, ctx, acceptance: Acceptance, target_probs=None, output=None):
        if output is None or output.hidden is None:
            raise ValueError("SpatialDrafter needs the verify pass's hidden states")
        newest = ctx.positions - self.start
        hidden, uncond_hidden = output.hidden, output.uncond_hidden
        if self.tree is not None:  # the accepted path's states, root first, like a chain's fed tokens
            path = acceptance.path_nodes.to(newest.device)

            def along_path(states):
                index = path.clamp(min=0)[..., None].expand(-1, -1, states.shape[-1])
                return states.gather(1, index.to(states.device))

            hidden = along_path(hidden)
            uncond_hidden = None if uncond_hidden is None else along_path(uncond_hidden)
        kept = hidden.shape[1]
        slots = newest[:, None] + 1 + torch.arange(kept, device=newest.device)[None]  # slot of each fed token
        fed_ok = torch.arange(kept, device=newest.device)[None] <= acceptance.num_accepted[:, None]
        if self.tree is not None:
            fed_ok &= path >= 0
        fed_ok &= slots < self.store.known.shape[1]
        safe = torch.where(fed_ok, slots, 0)
        for buffer, values in ((self.store.cond, hidden), (self.store.uncond, uncond_hidden)):
            if buffer is None or values is None:
                continue
            current = buffer.gather(1, safe[..., None].expand(-1, -1, buffer.shape[-1]))
            buffer.scatter_(1, safe[..., None].expand(-1, -1, buffer.shape[-1]),
                            torch.where(fed_ok[..., None], values.to(buffer.dtype), current))
        self.store.known.scatter_(1, safe, self.store.known.gather(1, safe) | fed_ok)

    def select_rows(self, rows):
        self.start = self.start[rows]
        self.store = _Hidden(self.store.cond[rows], None if self.store.uncond is None else self.store.uncond[rows],
                             self.store.known[rows])


def load_bundled_heads(device="cpu") -> SpatialHeads:
    return SpatialHeads.from_pretrained(BUNDLED_HEADS).to(device).eval()


@register_plugin("ssd")
class SSDPlugin(Plugin):
    modality = "vision"
    lossless = True
    paper = "SSD, spatially speculative decoding (arXiv:2606.20543); heads and drafting as in plugins/ssd"
    Config = SSDConfig
    requires = CodeGrid
    head_trainer = "mmspec.plugins.ssd.train:train_ssd_heads"
    # Under sampling a static tree's first child at each node is drawn from the heads (see SpatialDrafter):
    # flat image targets keep a sampled draft far more often than a top-ranked one.
    sampled_tree_children = True
    bench_default_variants = ({"batch_size": 1}, {"batch_size": 4})
    bench_variants = tuple({"batch_size": 4, "num_samples": 40, "settings": {"num_draft_tokens": k}}
                           for k in (2, 6)) + ({"batch_size": 4, "num_samples": 40, "settings": {"temperature": 0.0}},
                                               {"batch_size": 1, "settings": {"tree_branching": "3,2,1"}},
                                               {"batch_size": 4, "num_samples": 40,
                                                "settings": {"tree_branching": "3,2,1", "temperature": 0.0}},
                                               {"batch_size": 4, "num_samples": 40,
                                                "settings": {"tree_branching": "4,2,2,1,1,1", "temperature": 0.0}},
                                               # what `mmspec plan-tree ssd` chose on the 2-core CPU of the rows
                                               {"batch_size": 1, "settings": {"num_draft_tokens": 2}})

    def __init__(self, **config):
        super().__init__(**config)
        self._heads: SpatialHeads | None = None
        self.tree = parse_branching(self.config.tree_branching, "SSDConfig.tree_branching")

    def heads(self, device) -> SpatialHeads:
        if self._heads is None:
            self._heads = load_head(SpatialHeads, self.config.heads_path or BUNDLED_HEADS, "SSDConfig.heads_path")
        return self._heads.to(device)

    def check_pipeline(self, pipeline) -> None:
        """Also: the heads must fit this pipeline's codebook and grid width (fail at load time)."""
        super().check_pipeline(pipeline)
        grid, heads = pipeline.token_structure, self.heads("cpu")
        where = self.config.heads_path or "the bundled heads (trained on llamagen-tiny)"
        if grid.latents is not None and grid.latents.shape[0] != heads.config.vocab_size:
            raise ValueError(f"plugin 'ssd': {where} draft over {heads.config.vocab_size} codes, this pipeline's "
                             f"codebook has {grid.latents.shape[0]}; train heads for it "
                             "(mmspec train-head ssd --model ... --out DIR) and pass heads_path=DIR")
        if heads.config.grid_width != grid.cols:
            raise ValueError(f"plugin 'ssd': {where} were trained for grid width {heads.config.grid_width}, "
                             f"this pipeline's images are {grid.cols} codes wide; train heads for it "
                             "(mmspec train-head ssd --model ... --out DIR) and pass heads_path=DIR")

    def save_pretrained(self, directory):
        """The heads this plugin drafts with, under `ssd_heads/`."""
        self.heads("cpu").save_pretrained(directory / "ssd_heads")
        return {"heads_path": "ssd_heads"}

    def build_decoder(self, pipeline, request):
        target, logits, structure = request.target, request.logits, request.structure
        grid = (structure.rows, structure.cols)
        heads = self.heads(target.device)
        k = self.config.num_draft_tokens if self.tree is None else self.tree.max_depth
        if k >= grid[1]:
            name = "num_draft_tokens" if self.tree is None else "the depth of tree_branching"
            raise ValueError(f"{name} must be below the grid width ({grid[1]}), got {k}: a draft's "
                             "source state must be a token the target has already verified")
        if heads.config.vocab_size != target.vocab_size:
            raise ValueError(f"the SSD heads' vocabulary ({heads.config.vocab_size}) does not match the "
                             f"target's ({target.vocab_size})")
        if heads.config.grid_width != grid[1]:
            raise ValueError(f"the SSD heads were trained for grid width {heads.config.grid_width}, "
                             f"this image has {grid[1]}")
        guidance = target.guidance_scale if isinstance(target, CFGModel) else None
        rule = GreedyMatch() if logits.greedy else SpeculativeSampling()
        drafter = SpatialDrafter(heads, grid, guidance, tree=self.tree, sampled_children=self.sampled_tree_children)
        return SpeculativeDecoder(target, drafter, rule, logits, num_draft_tokens=k if self.tree is None else 0,
                                  eos_token_id=request.eos_token_id, pad_token_id=request.pad_token_id)
