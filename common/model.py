"""ARModel adapters: the one interface every decoding strategy talks to.

An adapter wraps an autoregressive network and owns its KV cache inside a
`DecodeState`. It is fed tokens at explicit per-row positions, so rows of a
batch may sit at different lengths (ragged acceptance), and it can roll rows
back (`crop`), resolve a verified tree (`keep`) and drop finished rows
(`select_rows`). Logits come back as float32 [B, L, V].
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .compiled import CompileSettings, length_bucket
from .slots import SlotTable, additive_mask
from .tree import TreeSpec


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [B, L, V] float32
    hidden: torch.Tensor | None = None  # [B, L, H] last hidden state, when asked for
    uncond_hidden: torch.Tensor | None = None  # [B, L, H] the unconditional rows' hidden state (CFGModel)


@dataclass
class DecodeState:
    cache: Any  # the model's KV cache object
    slots: SlotTable
    extra: dict | None = None  # adapter-specific (e.g. CFG position offsets)


def left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, allow_empty: bool = False):
    """Return (ids, mask, lengths) with every row's tokens moved to the right edge (left padding)."""
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
    attention_mask = attention_mask.to(torch.bool)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                         f"{tuple(input_ids.shape)}")
    lengths = attention_mask.sum(1)
    if not allow_empty and (input_ids.shape[1] == 0 or bool((lengths == 0).any())):
        raise ValueError("prompt is empty: every row of input_ids needs at least one token "
                         "(e.g. a BOS or class token)")
    # Stable sort puts padding first while keeping token order.
    order = torch.sort(attention_mask.to(torch.int8), dim=1, stable=True).indices
    return input_ids.gather(1, order), attention_mask.gather(1, order), lengths


class ARModel:
    """Adapter base class. Subclasses implement `new_state`, `_run` and `_map_kv`."""

    vocab_size: int
    device: torch.device
    compact_slack: int = 64
    # Positions the model can take (None: no limit). Decoders check prompt + max_new_tokens against it once,
    # before decoding, so the forwards themselves need no check (reading positions back would sync the host).
    max_positions: int | None = None
    # Set (a CompileSettings) by adapters that run compiled forwards at static shapes: `forward` then pads the
    # fed length to a bucket (`mmspec.common.compiled`).
    static_shapes: CompileSettings | None = None

    # --- subclass hooks -------------------------------------------------
    def new_state(self, batch_size: int) -> DecodeState:
        raise NotImplementedError

    def _run(self, state: DecodeState, tokens, positions, mask4d, output_hidden: bool) -> ModelOutput:
        """Run the network on tokens [B, L] with an additive mask [B, 1, L, S+L]; append their KV."""
        raise NotImplementedError

    def _map_kv(self, state: DecodeState, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace every cached K and V tensor [B, heads, S, dim] by fn(tensor)."""
        raise NotImplementedError

    def mask_dtype(self) -> torch.dtype:
        return torch.float32

    def token_embeddings(self) -> torch.Tensor:
        """[V, D] the input embedding of every output token (methods that compare tokens by embedding)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its token embeddings")

    def output_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[.., H] last hidden states -> [.., V] float32 logits: the model's own output layer, for heads that
        predict hidden states (EAGLE)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its output layer")

    def input_embedding_module(self) -> torch.nn.Module:
        """The token-embedding module every `_run` calls on the fed ids (methods that feed learned inputs of
        their own through hooks on it, e.g. `ptp`'s registers)."""
        raise NotImplementedError(f"{type(self).__name__} does not name its token-embedding module")

    # --- the protocol ---------------------------------------------------
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_hidden: bool = False) -> tuple[DecodeState, ModelOutput | None]:
        """Feed a prompt [B, T] (rows may be empty; T may be 0, then nothing runs and the output is None)."""
        ids, mask, _ = left_align(input_ids, attention_mask, allow_empty=True)
        state = self.new_state(ids.shape[0])
        if ids.shape[1] == 0:
            return state, None
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)
        out = self.forward(state, ids, positions, token_mask=mask, output_hidden=output_hidden)
        return state, out

    def set_prefill_requests(self, requests: torch.Tensor) -> None:
        """Told before each prefill a decode loop runs which requests of its call (indices into the call's
        rows, [B] long) that prefill's rows are. An adapter holding data per request (e.g. the image each row
        reads) looks its rows up here; with continuous batching they are not 0..B-1. The default keeps none."""

    def begin_decode(self, state: DecodeState, last_prompt_tokens: torch.Tensor) -> None:
        """Told the prompts' last tokens (fed with the first drafts), in prefill's row layout."""

    def forward(self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor, *,
                token_mask: torch.Tensor | None = None, tree: TreeSpec | None = None,
                tree_nodes: torch.Tensor | None = None, output_hidden: bool = False,
                query_only: torch.Tensor | None = None) -> ModelOutput:
        """tokens, positions: [B, L]. With `tree`, tree_nodes [L] names the tree node of each token.

        token_mask [B, L]: False marks padding. query_only [B, L]: True marks a token fed only for its
        output (e.g. a placeholder): it attends as usual, but nothing sees it and it is not kept.
        """
        if tokens.shape != positions.shape:
            raise ValueError(f"tokens {tuple(tokens.shape)} and positions {tuple(positions.shape)} differ")
        if (tree is None) != (tree_nodes is None):
            raise ValueError("tree and tree_nodes go together")
        length = tokens.shape[1]
        padding = length_bucket(length) - length if self.static_shapes is not None and length else 0
        if padding:  # fed as dead tokens (token_mask False): they see only themselves and no one sees them
            def pad(t, value):
                return torch.nn.functional.pad(t, (0, padding), value=value)

            token_mask = pad(torch.ones_like(tokens, dtype=torch.bool) if token_mask is None else token_mask, False)
            query_only = None if query_only is None else pad(query_only, False)
            tree_nodes = None if tree_nodes is None else pad(tree_nodes, -1)
            positions = torch.cat([positions, positions[:, -1:].expand(-1, padding)], 1)
            tokens = pad(tokens, 0)
        mask = state.slots.attention_mask(positions, token_mask, tree_nodes, tree, query_only)
        out = self._run(state, tokens, positions, additive_mask(mask, self.mask_dtype()), output_hidden)
        state.slots.append(positions, token_mask, tree_nodes, tree, query_only)
        if padding:
            out = ModelOutput(*(None if t is None else t[:, :length] for t in
                                (out.logits, out.hidden, out.uncond_hidden)))
        return out

    def crop(self, state: DecodeState, lengths: torch.Tensor) -> None:
        """Row b keeps positions < lengths[b] ([B] long)."""
        state.slots.crop(lengths)
        self._tidy(state)

    def keep(self, state: DecodeState, path_nodes: torch.Tensor) -> None:
        """Keep the accepted tree path: path_nodes [B, P] node ids, -1 padded."""
        state.slots.keep(path_nodes)
        self._tidy(state)

    def release(self, state: DecodeState, positions: torch.Tensor) -> None:
        """Forget the tokens at positions [B, n] (-1 = none) anywhere in the sequence, e.g. a placeholder
        that was fed only for its query (next-set decoding)."""
        state.slots.release(positions)
        self._tidy(state)

    def select_rows(self, state: DecodeState, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` ([B'] long), in that order."""
        state.slots.select_rows(rows)
        self._map_kv(state, lambda t: t.index_select(0, rows.to(t.device)))
        self._tidy(state)

    def append_rows(self, state: DecodeState, other: DecodeState) -> None:
        """Put the rows of `other` (a state of this adapter, e.g. newly prefilled requests) after `state`'s
        rows, in place: continuous batching admits requests into a running batch this way."""
        if not self.can_append_rows():
            raise NotImplementedError(f"{type(self).__name__} keeps per-row data beyond its KV cache and does not "
                                      "implement append_rows")
        if state.slots.batch_size == 0:  # every running row had finished: the new rows are the batch
            state.cache, state.slots = other.cache, other.slots
            return
        width = max(state.slots.num_slots, other.slots.num_slots)
        theirs: list[torch.Tensor] = []
        self._map_kv(other, lambda t: theirs.append(t) or t)
        queue = iter(theirs)

        def join(t: torch.Tensor) -> torch.Tensor:
            new = next(queue, None)
            if new is None:  # `other` fed nothing yet (an empty prompt): its rows hold no keys
                new = t.new_zeros(other.slots.batch_size, t.shape[1], 0, t.shape[3])
            widen = lambda x: torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[2]))  # noqa: E731
            return torch.cat([widen(t), widen(new.to(t.device, t.dtype))], 0)

        self._map_kv(state, join)
        if next(queue, None) is not None:
            raise RuntimeError("append_rows: the running batch holds no keys yet; start it with its own prefill")
        state.slots.append_rows(other.slots)
        self._tidy(state)

    def can_append_rows(self) -> bool:
        """Whether `append_rows` is right for this adapter: it is when all per-row data lives in the KV cache
        and the slot table (the class keeps the base `select_rows`), or when the class implements its own."""
        cls = type(self)
        return cls.append_rows is not ARModel.append_rows or cls.select_rows is ARModel.select_rows

    def prefill_input_rows(self, prefill_input: tuple, rows: torch.Tensor, total: int) -> tuple:
        """The `prefill_input` (ids, mask) of requests `rows` out of `total` (this adapter's row layout)."""
        ids, mask = prefill_input[:2]
        return ids[rows], mask[rows]

    TIDY_EVERY = 16  # rollbacks between tidies: a decode step crops (and keeps a tree path) once or twice

    def _tidy(self, state: DecodeState) -> None:
        """Drop slots dead in every row and compact when dead slots pile up. Reading how many there are makes
        the host wait for the device, so it runs only after `TIDY_EVERY` rollbacks (every eight steps or so)
        and once the cache has grown by twice `compact_slack` slots: dead slots cost attention width, never
        correctness (they are masked), and a tree step appends all its nodes, of which a few stay live.
        compact_slack=0 asks for no dead slots at all: then every rollback tidies."""
        slots = state.slots
        slots.tidy_wait -= 1
        if self.compact_slack and (slots.num_slots < slots.tidy_at or slots.tidy_wait > 0):
            return
        drop, max_live = slots.tidy_plan()
        if drop:
            slots.drop_trailing(drop)
            self._map_kv(state, lambda t: t[:, :, : t.shape[2] - drop])
        order = slots.compaction_index(max_live, self.compact_slack)
        if order is not None:
            def gather(t):
                idx = order.to(t.device)[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
                return t.gather(2, idx)
            self._map_kv(state, gather)
        slots.tidy_at, slots.tidy_wait = slots.num_slots + 2 * self.compact_slack, self.TIDY_EVERY


def hf_cache_kwarg(module) -> str:
    """transformers renamed `past_key_values` to `cache` (deprecated in 5.x); the name this version takes."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def map_dynamic_cache(cache, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Apply fn to every initialised K and V tensor [B, heads, S, dim] of a transformers DynamicCache."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", True) and getattr(layer, "keys", None) is not None \
                and layer.keys.numel():
            layer.keys, layer.values = fn(layer.keys), fn(layer.values)


class HFCausalLM(ARModel):
    """Adapter for any Hugging Face `transformers` causal LM that takes a 4-D attention mask.

    The mask is passed as an additive float tensor, which both the eager and
    the SDPA attention paths accept unchanged.
    """

    def __init__(self, model, compact_slack: int = 64):
        from transformers import DynamicCache  # noqa: F401  (fail early if transformers is missing)

        self.model = model
        self.config = model.config
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.device = next(model.parameters()).device
        self.compact_slack = compact_slack
        self._cache_kwarg = hf_cache_kwarg(model)

    def mask_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def token_embeddings(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight[: self.vocab_size]

    def input_embedding_module(self):
        return self.model.get_input_embeddings()

    def output_logits(self, hidden):
        return self.model.get_output_embeddings()(hidden).float()

    def new_state(self, batch_size: int) -> DecodeState:
        from transformers import DynamicCache

        return DecodeState(cache=DynamicCache(config=self.config), slots=SlotTable.empty(batch_size, self.device))

    def _run(self, state, tokens, positions, mask4d, output_hidden):
        out = self.model(input_ids=tokens.to(self.device), position_ids=positions.to(self.device),
                         attention_mask=mask4d.to(self.device), use_cache=True,
                         output_hidden_states=output_hidden, **{self._cache_kwarg: state.cache})
        hidden = out.hidden_states[-1] if output_hidden else None
        return ModelOutput(logits=out.logits.float(), hidden=hidden)

    def _map_kv(self, state, fn):
        map_dynamic_cache(state.cache, fn)


class EncoderDecoderRows:
    """Mixin for encoder-decoder adapters whose state holds an `EncoderDecoderCache` and the encoder's output
    in `state.extra` ("encoder_states", optionally "encoder_mask"): the decoder's self-attention K/V follow
    the slot table; the cross-attention K/V and the encoder output follow rows only."""

    def _map_kv(self, state, fn):
        map_dynamic_cache(state.cache.self_attention_cache, fn)  # cross-attention K/V follow rows, not lengths

    def select_rows(self, state, rows):
        super().select_rows(state, rows)
        rows = rows.to(self.device)
        map_dynamic_cache(state.cache.cross_attention_cache, lambda t: t.index_select(0, rows))
        for key in ("encoder_states", "encoder_mask"):
            if state.extra.get(key) is not None:
                state.extra[key] = state.extra[key].index_select(0, rows)


def cfg_combine(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance u + s·(c − u) of conditional and unconditional logits (same shape).

    The one place the formula lives: the target adapter and every drafter head that mimics it use this,
    so drafts are guided exactly as the target's logits are.
    """
    return uncond + scale * (cond - uncond)


class CFGModel(ARModel):
    """Classifier-free guidance as an adapter: rows [cond; uncond], logits u + s·(c − u).

    `prefill` takes 2B rows: the B conditional prompts followed by their B
    unconditional prompts (padded to one length). Afterwards callers see B
    rows; positions are those of the conditional rows, and each unconditional
    row is shifted by its own prompt-length difference.
    """

    def __init__(self, base: ARModel, guidance_scale: float):
        if not isinstance(guidance_scale, (int, float)) or not guidance_scale >= 0:  # rejects nan too
            raise ValueError(f"guidance_scale must be a number >= 0, got {guidance_scale!r}")
        self.base = base
        self.guidance_scale = float(guidance_scale)
        self.vocab_size = base.vocab_size
        self.device = base.device
        self.max_positions = base.max_positions

    def token_embeddings(self) -> torch.Tensor:
        return self.base.token_embeddings()

    def output_logits(self, hidden):
        return self.base.output_logits(hidden)

    def combine(self, logits: torch.Tensor) -> torch.Tensor:
        cond, uncond = logits.chunk(2, dim=0)
        return cfg_combine(cond, uncond, self.guidance_scale)

    def prefill(self, input_ids, attention_mask=None, output_hidden=False):
        if input_ids.shape[0] % 2:
            raise ValueError("CFGModel.prefill needs 2B rows: B conditional prompts then B unconditional ones")
        state, out = self.base.prefill(input_ids, attention_mask, output_hidden)
        lengths = (attention_mask.bool().sum(1) if attention_mask is not None
                   else torch.full((input_ids.shape[0],), input_ids.shape[1]))
        cond_len, uncond_len = lengths.to(self.device).chunk(2)
        state.extra = {"uncond_shift": uncond_len - cond_len}
        return state, None if out is None else self._combine_output(out)

    def _combine_output(self, out: ModelOutput) -> ModelOutput:
        cond, uncond = out.hidden.chunk(2, dim=0) if out.hidden is not None else (None, None)
        return ModelOutput(logits=self.combine(out.logits), hidden=cond, uncond_hidden=uncond)

    def _double(self, state, positions):
        shift = state.extra["uncond_shift"].to(positions.device)[:, None]
        return torch.cat([positions, positions + shift], 0)

    def begin_decode(self, state, last_prompt_tokens):
        # The unconditional prompt ends with its own token (e.g. the null class), not the conditional one.
        state.extra["uncond_last"] = last_prompt_tokens.chunk(2)[1]
        self.base.begin_decode(state, last_prompt_tokens)

    def forward(self, state, tokens, positions, *, token_mask=None, tree=None, tree_nodes=None,
                output_hidden=False, query_only=None):
        uncond_tokens = tokens
        if "uncond_last" in state.extra:  # -1: a row past its first step (admitted rows start later)
            last = state.extra.pop("uncond_last").to(tokens.device)
            uncond_tokens = tokens.clone()
            uncond_tokens[:, 0] = torch.where(last >= 0, last, tokens[:, 0])
        out = self.base.forward(
            state, torch.cat([tokens, uncond_tokens], 0), self._double(state, positions),
            token_mask=None if token_mask is None else torch.cat([token_mask, token_mask], 0),
            tree=tree, tree_nodes=tree_nodes, output_hidden=output_hidden,
            query_only=None if query_only is None else torch.cat([query_only, query_only], 0))
        return self._combine_output(out)

    def crop(self, state, lengths):
        shift = state.extra["uncond_shift"].to(lengths.device)
        self.base.crop(state, torch.cat([lengths, lengths + shift]))

    def keep(self, state, path_nodes):
        self.base.keep(state, torch.cat([path_nodes, path_nodes], 0))

    def release(self, state, positions):
        shift = state.extra["uncond_shift"].to(positions.device)[:, None]
        self.base.release(state, torch.cat([positions, torch.where(positions >= 0, positions + shift, -1)]))

    def select_rows(self, state, rows):
        if "uncond_last" in state.extra:
            state.extra["uncond_last"] = state.extra["uncond_last"][rows.to(self.device)]
        batch = state.extra["uncond_shift"].shape[0]
        self.base.select_rows(state, torch.cat([rows, rows + batch]))
        state.extra["uncond_shift"] = state.extra["uncond_shift"][rows.to(self.device)]

    def append_rows(self, state, other):
        old, new = state.extra["uncond_shift"].shape[0], other.extra["uncond_shift"].shape[0]
        self.base.append_rows(state, other)  # [cond_old; uncond_old; cond_new; uncond_new]
        order = torch.cat([torch.arange(old), 2 * old + torch.arange(new), old + torch.arange(old),
                           2 * old + new + torch.arange(new)]).to(self.device)
        self.base.select_rows(state, order)  # back to [cond; uncond]
        lasts = [x.extra.get("uncond_last", torch.full((n,), -1, dtype=torch.long, device=self.device))
                 for x, n in ((state, old), (other, new))]
        state.extra["uncond_last"] = torch.cat([t.to(self.device) for t in lasts])
        shifts = [state.extra["uncond_shift"], other.extra["uncond_shift"].to(self.device)]
        state.extra["uncond_shift"] = torch.cat(shifts)

    def can_append_rows(self) -> bool:
        return self.base.can_append_rows()

    def prefill_input_rows(self, prefill_input, rows, total):
        ids, mask = prefill_input[:2]
        both = torch.cat([rows, rows + total])
        return ids[both], mask[both]

