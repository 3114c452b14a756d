"""A class-conditional LlamaGen-architecture GPT over VQ codes, as a diffusers model.

Module names and config fields follow LlamaGen's `Transformer` (tok_embeddings,
cls_embedding.embedding_table, layers.N.attention.wqkv/wo,
layers.N.feed_forward.w1/w2/w3, attention_norm, ffn_norm, norm, output), so
a LlamaGen C2I checkpoint's state dict loads with `load_llamagen_state_dict`.
RMSNorm, SwiGLU, 2-D RoPE over the token grid (prefix tokens unrotated), a
class embedding with one extra "null" class for classifier-free guidance. The
decoder layer is the core's (`mmspec.common.layers`); the 2-D RoPE tables and
the class embedding are LlamaGen's own.

Token ids: 0..vocab_size-1 are image codes; vocab_size + c is the prefix token
of class c (c = num_classes is the null class). Logits cover image codes only.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn as nn
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from mmspec.common.compiled import StaticKV, as_compile_settings, compiled_function, static_inputs
from mmspec.common.layers import RMSNorm, TransformerBlock, find_multiple
from mmspec.common.model import ARModel, DecodeState, ModelOutput
from mmspec.common.slots import SlotTable


def rope_2d_tables(grid: int, head_dim: int, base: float, prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [prefix + grid*grid, head_dim//2]: the first half of each head rotates with the row,
    the second half with the column. Prefix positions get cos = sin = 0, as in LlamaGen (its class
    token's queries and keys are zeroed); kept so LlamaGen checkpoints behave as trained."""
    quarter = head_dim // 4
    freqs = 1.0 / (base ** (torch.arange(0, quarter, dtype=torch.float64) / quarter))
    idx = torch.arange(grid, dtype=torch.float64)
    rows = torch.outer(idx, freqs)  # [grid, quarter]
    angles = torch.cat([rows[:, None, :].expand(grid, grid, quarter),
                        rows[None, :, :].expand(grid, grid, quarter)], -1).reshape(grid * grid, 2 * quarter)
    zeros = torch.zeros(prefix, 2 * quarter)
    return torch.cat([zeros, angles.cos().float()]), torch.cat([zeros, angles.sin().float()])


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + 1, dim)  # + the null class for CFG


class LlamaGenModel(ModelMixin, ConfigMixin):
    """Class-conditional LlamaGen GPT (c2i). Field names follow LlamaGen's ModelArgs."""

    @register_to_config
    def __init__(self, dim: int = 256, n_layer: int = 6, n_head: int = 4, n_kv_head: int | None = None,
                 multiple_of: int = 64, ffn_dim_multiplier: float | None = None, rope_base: float = 10000.0,
                 norm_eps: float = 1e-5, num_classes: int = 10, class_dropout_prob: float = 0.1,
                 vocab_size: int = 512, cls_token_num: int = 1, block_size: int = 256,
                 token_dropout_p: float = 0.1, resid_dropout_p: float = 0.1):
        super().__init__()
        if cls_token_num != 1:
            raise ValueError(f"cls_token_num must be 1 for class-conditional models, got {cls_token_num}")
        grid = math.isqrt(block_size)
        if grid * grid != block_size:
            raise ValueError(f"block_size must be a square number of tokens, got {block_size}")
        if dim % n_head or (dim // n_head) % 4:
            raise ValueError(f"dim/n_head must be a multiple of 4 for 2-D RoPE, got dim={dim}, n_head={n_head}")
        n_kv_head = n_kv_head or n_head
        hidden = int(2 * 4 * dim / 3)
        if ffn_dim_multiplier is not None:
            hidden = int(ffn_dim_multiplier * hidden)
        hidden = find_multiple(hidden, multiple_of)
        self.grid_size = grid
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.cls_embedding = LabelEmbedder(num_classes, dim)
        self.tok_dropout = nn.Dropout(token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(dim, n_head, n_kv_head, hidden, norm_eps) for _ in range(n_layer))
        self.norm = RMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        cos, sin = rope_2d_tables(grid, dim // n_head, rope_base, cls_token_num)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    @property
    def null_class(self) -> int:
        return self.config.num_classes

    def class_token(self, labels: torch.Tensor) -> torch.Tensor:
        """Prefix token ids for class labels (num_classes = the null class)."""
        return labels + self.config.vocab_size

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        vocab = self.config.vocab_size
        is_class = tokens >= vocab
        image = self.tok_embeddings(tokens.clamp(max=vocab - 1))
        label = self.cls_embedding.embedding_table((tokens - vocab).clamp(min=0))
        return torch.where(is_class[..., None], label, image)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                caches: list | None = None, output_hidden: bool = False):
        """tokens, positions [B, L]; mask: additive [B, 1, L, S+L] or None for causal; caches: per-layer [k, v]."""
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
        # Decoders check their position budget once (`ARModel.max_positions`); reading positions back here on
        # every cached decode step would make the host wait for the device.
        if caches is None and int(positions.max()) >= self.rope_cos.shape[0]:
            raise ValueError(f"position {int(positions.max())} is beyond the {self.config.block_size}-token grid "
                             "plus the class token")
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x = self.tok_dropout(self.embed(tokens))
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, None if caches is None else caches[i])
        hidden = self.norm(x)
        logits = self.output(hidden)
        return (logits, hidden) if output_hidden else logits


class LlamaGenAdapter(ARModel):
    """ARModel adapter for `LlamaGenModel` with its own per-layer KV lists."""

    def __init__(self, model: LlamaGenModel, compact_slack: int = 64, compile=None):
        """compile: run the step forward through `torch.compile` at static shapes (see
        `mmspec.common.compiled.as_compile_settings` for the accepted values; None / False: eager)."""
        self.model = model
        self.static_shapes = as_compile_settings(compile)
        self.vocab_size = model.config.vocab_size
        self.device = next(model.parameters()).device
        self.compact_slack = compact_slack
        self.max_positions = model.rope_cos.shape[0]  # the grid plus the class token

    def mask_dtype(self):
        return next(self.model.parameters()).dtype

    def token_embeddings(self) -> torch.Tensor:
        return self.model.tok_embeddings.weight

    def output_logits(self, hidden):
        return self.model.output(hidden).float()

    def new_state(self, batch_size: int) -> DecodeState:
        if self.static_shapes is not None:
            attention = self.model.layers[0].attention
            caches = StaticKV(len(self.model.layers), attention.n_kv_head, attention.head_dim, self.mask_dtype(),
                              self.device, self.static_shapes)
        else:
            caches = [[None, None] for _ in self.model.layers]
        return DecodeState(cache=caches, slots=SlotTable.empty(batch_size, self.device))

    def _run(self, state, tokens, positions, mask4d, output_hidden):
        if isinstance(state.cache, StaticKV):
            return self._run_static(state, tokens, positions, mask4d, output_hidden)
        logits, hidden = self.model(tokens.to(self.device), positions.to(self.device), mask4d.to(self.device),
                                    state.cache, output_hidden=True)
        return ModelOutput(logits=logits.float(), hidden=hidden if output_hidden else None)

    def _run_static(self, state, tokens, positions, mask4d, output_hidden):
        cache, (batch, length), slots = state.cache, tokens.shape, state.slots.num_slots
        cache.reserve(batch, slots + length)
        tokens, positions, mask = static_inputs(tokens.to(self.device), positions.to(self.device),
                                                mask4d.to(self.device), cache, slots)
        step = compiled_function(self.model, self.static_shapes, lambda: partial(_static_step, self.model))
        logits, hidden, new_keys = step(tokens, positions, mask, cache.past())
        cache.write(new_keys, batch, slots)
        return ModelOutput(logits=logits[:batch].float(), hidden=hidden[:batch] if output_hidden else None)

    def _map_kv(self, state, fn):
        if isinstance(state.cache, StaticKV):
            state.cache.map(fn)
            return
        for layer in state.cache:
            if layer[0] is not None:
                layer[0], layer[1] = fn(layer[0]), fn(layer[1])


def _static_step(model: LlamaGenModel, tokens, positions, mask, past):
    """One forward over fixed-capacity past keys: (logits, hidden, the new tokens' (k, v) per layer)."""
    caches = [[k, v, None] for k, v in past]
    logits, hidden = model(tokens, positions, mask, caches, output_hidden=True)
    return logits, hidden, [cache[2] for cache in caches]


def load_llamagen_state_dict(model: LlamaGenModel, state_dict: dict) -> None:
    """Load a LlamaGen C2I checkpoint (its `model` entry, or the bare state dict).

    Names match one to one; LlamaGen's precomputed `freqs_cis` buffer is dropped
    because this model builds its own RoPE tables. Strict otherwise.
    """
    if "model" in state_dict and isinstance(state_dict["model"], dict):
        state_dict = state_dict["model"]
    state_dict = {k: v for k, v in state_dict.items() if k != "freqs_cis"}
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise ValueError(f"LlamaGen checkpoint does not match the config: missing {missing}, "
                         f"unexpected {unexpected}")
