"""ARModel adapters for the image-generation mode of Hugging Face multimodal models.

Janus (`JanusForConditionalGeneration`), Emu3 (`Emu3ForConditionalGeneration`) and
Chameleon / Anole (`ChameleonForConditionalGeneration`) all generate an image as a
sequence of VQ codes after a text prompt. Each adapter here returns logits over the
image *codebook* only (index 0..N-1, N = codebook size), so plugins, acceptance rules
and the logits pipeline see a codebook-sized distribution, exactly like
`LlamaGenAdapter`.

Token ids, shared by the three adapters (as LlamaGen's class tokens):

- `0 <= t < N`: image code t (the decoder's generated tokens);
- `t >= N`: prompt token with language-model id `t - N` (`adapter.prompt_ids(lm_ids)`).

Token ids describe themselves because `SpeculativeDecoder` feeds the prompt's last
token in the same forward as the first drafts (and plugins may feed prompt and code
tokens in one block), so the adapter never has to infer from context whether a token
is text or an image code.

Every adapter runs the model's decoder with explicit per-row `position_ids` and the
additive float mask [B, 1, L, S] (transformers' `create_causal_mask` passes a 4-D
mask through unchanged; eager and SDPA attention accept it), and owns a
`DynamicCache`, so ragged rows, `crop`, `keep` (trees) and `select_rows` work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mmspec.common.model import ARModel, DecodeState, ModelOutput, hf_cache_kwarg, map_dynamic_cache
from mmspec.common.slots import SlotTable, additive_mask
from mmspec.common.tree import TreeSpec


class _HFImageAdapter(ARModel):
    """Shared plumbing: the token-id convention, the DynamicCache, running the model's decoder."""

    def __init__(self, model, num_codes: int, decoder, text_config, compact_slack: int = 64):
        from transformers import DynamicCache  # noqa: F401  (fail early if transformers is missing)

        self.model = model
        self.vocab_size = int(num_codes)
        self.device = next(model.parameters()).device
        self.compact_slack = compact_slack
        self._decoder = decoder
        self._text_config = text_config
        self._cache_kwarg = hf_cache_kwarg(decoder)

    @property
    def text_offset(self) -> int:
        """Prompt token ids are language-model ids plus this offset (= the codebook size)."""
        return self.vocab_size

    def prompt_ids(self, lm_ids: torch.Tensor) -> torch.Tensor:
        """Language-model token ids [B, T] -> this adapter's prompt token ids."""
        return lm_ids + self.text_offset

    def mask_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self._text_config)

    def new_state(self, batch_size: int) -> DecodeState:
        return DecodeState(cache=self._new_cache(), slots=SlotTable.empty(batch_size, self.device))

    def _kv(self, state):
        return state.cache

    def _decode(self, state, positions, mask4d, **inputs) -> torch.Tensor:
        """Run the decoder on input_ids= or inputs_embeds=; returns the last hidden state [B, L, H]."""
        out = self._decoder(position_ids=positions.to(self.device), attention_mask=mask4d.to(self.device),
                            use_cache=True, **inputs, **{self._cache_kwarg: self._kv(state)})
        return out.last_hidden_state

    def _map_kv(self, state, fn):
        map_dynamic_cache(self._kv(state), fn)


class JanusImageAdapter(_HFImageAdapter):
    """Janus (`JanusForConditionalGeneration`) in image-generation mode.

    Janus generates images with separate modules, not its text vocabulary: the language
    model (Llama) reads prompt tokens through its text embeddings and image codes through
    `prepare_embeddings_for_image_generation` (`generation_embeddings` then
    `generation_aligner`), and `generation_head` turns hidden states into codebook logits.
    This adapter does the same: tokens `t >= N` (N = `vq_config.num_embeddings`) are
    prompt text ids `t - N` and go through the text embeddings; tokens `t < N` are image
    codes and go through the generation embeddings. Logits [B, L, N] come from
    `generation_head`. An image is `image_seq_len` (`vision_config.num_image_tokens`) codes.

    Classifier-free guidance: Janus's own `generate(generation_mode="image")` doubles the
    batch with an unconditional prompt of the same length in which every token but BOS and
    `<begin_of_image>` is replaced by the pad token, and mixes logits as u + s·(c − u).
    Wrap this adapter in `CFGModel(adapter, s)` and pass `prefill_input=adapter.cfg_prefill_input(
    lm_ids, attention_mask)` to `SpeculativeDecoder.generate` for the same computation.

    bos/boi/pad default to the model's generation config (`bos_token_id`, `pad_token_id`,
    `generation_kwargs["boi_token_id"]`); they are only used to build unconditional prompts.
    """

    def __init__(self, model, compact_slack: int = 64, bos_token_id: int | None = None,
                 boi_token_id: int | None = None, pad_token_id: int | None = None):
        config = model.config
        super().__init__(model, config.vq_config.num_embeddings, model.model.language_model,
                         config.get_text_config(), compact_slack)
        gen = getattr(model, "generation_config", None)
        gen_kwargs = (getattr(gen, "generation_kwargs", None) or {}) if gen is not None else {}
        self.bos_token_id = bos_token_id if bos_token_id is not None else getattr(gen, "bos_token_id", None)
        self.boi_token_id = boi_token_id if boi_token_id is not None else gen_kwargs.get("boi_token_id")
        self.pad_token_id = pad_token_id if pad_token_id is not None else getattr(gen, "pad_token_id", None)

    @property
    def image_seq_len(self) -> int:
        """Codes per generated image (Janus's `vision_config.num_image_tokens`)."""
        return self.model.config.vision_config.num_image_tokens

    def unconditional_ids(self, lm_ids: torch.Tensor) -> torch.Tensor:
        """Janus's unconditional prompt: every LM id except BOS and BOI replaced by the pad id."""
        if self.pad_token_id is None:
            raise ValueError("unconditional prompts need pad_token_id (set it in the generation config or here)")
        keep = torch.zeros_like(lm_ids, dtype=torch.bool)
        for special in (self.bos_token_id, self.boi_token_id):
            if special is not None:
                keep |= lm_ids == special
        return lm_ids.masked_fill(~keep, self.pad_token_id)

    def cfg_prefill_input(self, lm_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> tuple:
        """`prefill_input` for `CFGModel`: adapter ids of [cond; uncond] rows and their (shared) mask."""
        if attention_mask is None:
            attention_mask = torch.ones_like(lm_ids)
        both = torch.cat([lm_ids, self.unconditional_ids(lm_ids)])
        return self.prompt_ids(both), torch.cat([attention_mask, attention_mask])

    def token_embeddings(self) -> torch.Tensor:
        codes = torch.arange(self.vocab_size, device=self.device)
        return self.model.prepare_embeddings_for_image_generation(codes)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        n = self.vocab_size
        is_text = tokens >= n
        text = self.model.get_input_embeddings()((tokens - n).clamp(min=0))
        image = self.model.prepare_embeddings_for_image_generation(tokens.clamp(max=n - 1))
        return torch.where(is_text[..., None], text, image.to(text.dtype))

    def _run(self, state, tokens, positions, mask4d, output_hidden):
        hidden = self._decode(state, positions, mask4d, inputs_embeds=self.embed(tokens.to(self.device)))
        logits = self.model.model.generation_head(hidden)
        return ModelOutput(logits=logits.float(), hidden=hidden if output_hidden else None)

    def output_logits(self, hidden):
        return self.model.model.generation_head(hidden).float()


class _InVocabImageAdapter(_HFImageAdapter):
    """Emu3 / Chameleon: image codes are tokens of the language model's own vocabulary.

    `code_ids[c]` is the LM token id of code c; logits are the LM head's rows for those ids.
    """

    def __init__(self, model, img2bpe: dict, decoder, text_config, compact_slack: int):
        num = len(img2bpe)
        if sorted(img2bpe) != list(range(num)):
            raise ValueError("the model's image vocabulary does not cover codes 0..N-1 exactly")
        super().__init__(model, num, decoder, text_config, compact_slack)
        self.code_ids = torch.tensor([img2bpe[c] for c in range(num)], dtype=torch.long, device=self.device)
        lm_vocab = model.get_output_embeddings().weight.shape[0]
        # LM id -> code (-1 for non-image ids)
        self.lm_to_code = torch.full((lm_vocab,), -1, dtype=torch.long, device=self.device)
        self.lm_to_code[self.code_ids] = torch.arange(num, device=self.device)
        lo, hi = int(self.code_ids.min()), int(self.code_ids.max())
        # Real checkpoints keep image tokens in one contiguous id block: slice the head (a view) then permute.
        self._head_block = (lo, hi + 1, self.code_ids - lo) if hi - lo + 1 == num else None

    def token_embeddings(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight.index_select(0, self.code_ids)

    def codes_to_lm_ids(self, codes: torch.Tensor) -> torch.Tensor:
        return self.code_ids.to(codes.device)[codes]

    def lm_ids_to_codes(self, lm_ids: torch.Tensor) -> torch.Tensor:
        """LM ids -> codes (-1 where an id is not an image token)."""
        return self.lm_to_code.to(lm_ids.device)[lm_ids]

    def lm_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """Adapter tokens -> LM ids (prompt ids lose the offset, codes map to their image tokens)."""
        n = self.vocab_size
        return torch.where(tokens >= n, tokens - n, self.code_ids[tokens.clamp(0, n - 1)])

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[.., H] -> [.., N]: the LM head restricted to the image-token rows (the model's own forward
        may mask those rows, as Chameleon's does; this reads the head directly)."""
        head = self.model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        if self._head_block is not None:
            lo, hi, perm = self._head_block
            block = F.linear(hidden, weight[lo:hi], None if bias is None else bias[lo:hi])
            return block.index_select(-1, perm)
        return F.linear(hidden, weight.index_select(0, self.code_ids),
                        None if bias is None else bias.index_select(0, self.code_ids))

    def output_logits(self, hidden):
        return self.code_logits(hidden).float()


class ChameleonImageAdapter(_InVocabImageAdapter):
    """Chameleon / Anole (`ChameleonForConditionalGeneration`) image generation.

    Image codes are the `IMGIMG…` tokens of the LM vocabulary; code c is LM id
    `vocabulary_mapping.img2bpe[c]` (N = number of image tokens, the VQ codebook size), and an
    image is a plain run of codes after `<begin_image>` (no separators). Tokens `t >= N` are
    prompt LM ids `t - N`; tokens `t < N` are codes fed as their image token. Logits [B, L, N]
    are the LM head's image-token rows, permuted to code order.

    transformers quirk: `ChameleonForConditionalGeneration.forward` sets every image-token logit to
    the dtype minimum (the HF release only generates text), so its `generate` cannot produce
    images. This adapter runs `model.model` and applies `lm_head` itself.
    """

    def __init__(self, model, compact_slack: int = 64):
        super().__init__(model, model.model.vocabulary_mapping.img2bpe, model.model,
                         model.config.get_text_config(), compact_slack)

    def _run(self, state, tokens, positions, mask4d, output_hidden):
        hidden = self._decode(state, positions, mask4d, input_ids=self.lm_ids(tokens.to(self.device)))
        return ModelOutput(logits=self.code_logits(hidden).float(), hidden=hidden if output_hidden else None)


@dataclass
class _Emu3Cache:
    kv: object  # DynamicCache
    image_start: torch.Tensor  # [B] long; adapter position of each row's first image code


@dataclass(frozen=True, eq=False)
class _EOLTree:
    """A tree block with one end-of-line node per tree node: node i + num_base is i's EOL.

    The EOL of node i sees i, i's ancestors and their EOLs; node i sees the EOLs of its strict
    ancestors (an EOL that a row does not need is padding there, hence never visible).
    """

    num_base: int
    ancestor_mask: torch.Tensor


class Emu3ImageAdapter(_InVocabImageAdapter):
    """Emu3 (`Emu3ForConditionalGeneration`) image generation, end-of-line tokens handled inside.

    Emu3 writes an image of H×W codes row by row, each row followed by the end-of-line
    token `<|extra_200|>` (`vocabulary_mapping.eol_token_id`), after a prompt ending in
    `<|image start|>H*W<|image token|>`; `decode_image_tokens` expects that layout. The
    decoder's tokens here are plain codes (code c = LM id `vocabulary_mapping.img2bpe[c]`,
    N = number of visual tokens): after every W-th code of a row the adapter feeds the EOL
    token itself, in the same forward, and returns the next code's logits from the EOL's
    output, so greedy decoding gives the codes of Emu3's own constrained generation (the
    documented `prefix_allowed_tokens_fn` that allows visual tokens and forces EOL at row ends).

    `width` is W (codes per image row). A row's image starts right after its last prompt
    token (tokens `t >= N` are prompt LM ids `t - N`); adapter position p of code k maps to LM
    position p + k // W. The KV cache and slot table live in LM positions; `crop`, `keep` and
    `select_rows` translate. An EOL is also inserted after the image's last row (Emu3's
    layout has it); its logits are unused.
    """

    def __init__(self, model, width: int, compact_slack: int = 64):
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"width must be an int >= 1 (codes per image row), got {width!r}")
        mapping = model.model.vocabulary_mapping
        super().__init__(model, mapping.img2bpe, model.model.text_model, model.config.get_text_config(),
                         compact_slack)
        if mapping.eol_token_id is None:
            raise ValueError("the vocabulary map has no end-of-line token <|extra_200|>")
        self.width = width
        self.eol_token_id = int(mapping.eol_token_id)
        self._trees: dict[int, tuple[TreeSpec, _EOLTree]] = {}

    def new_state(self, batch_size):
        start = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        return DecodeState(cache=_Emu3Cache(self._new_cache(), start), slots=SlotTable.empty(batch_size, self.device))

    def _kv(self, state):
        return state.cache.kv

    def _lm_positions(self, state, positions):
        rel = positions - state.cache.image_start[:, None]
        return positions + rel.clamp(min=0) // self.width

    def _eol_tree(self, tree: TreeSpec) -> _EOLTree:
        if tree.ancestor_mask.dim() != 2:
            raise NotImplementedError("Emu3's end-of-line tokens are laid out for one tree shared by every row; "
                                      "dynamic (per-row) draft trees are not supported for Emu3 yet: use "
                                      "tree_branching or a chain")
        hit = self._trees.get(id(tree))
        if hit is None or hit[0] is not tree:
            anc = tree.ancestor_mask.to(self.device)
            strict = anc & ~torch.eye(anc.shape[0], dtype=torch.bool, device=self.device)
            full = torch.cat([torch.cat([anc, strict], 1), torch.cat([anc, anc], 1)], 0)
            hit = (tree, _EOLTree(anc.shape[0], full))
            self._trees[id(tree)] = hit
        return hit[1]

    def forward(self, state, tokens, positions, *, token_mask=None, tree=None, tree_nodes=None,
                output_hidden=False, query_only=None):
        if query_only is not None:
            raise NotImplementedError("Emu3's end-of-line tokens follow the code positions fed, so query-only "
                                      "tokens (next-set decoding placeholders) are not supported for Emu3 yet")
        if tokens.shape != positions.shape:
            raise ValueError(f"tokens {tuple(tokens.shape)} and positions {tuple(positions.shape)} differ")
        if (tree is None) != (tree_nodes is None):
            raise ValueError("tree and tree_nodes go together")
        dev, n = self.device, self.vocab_size
        tokens, positions = tokens.to(dev), positions.to(dev)
        batch, length = tokens.shape
        valid = (torch.ones_like(tokens, dtype=torch.bool) if token_mask is None
                 else token_mask.to(dev, torch.bool))
        tokens = tokens.masked_fill(~valid, n)  # padding: any valid id (LM id 0), never seen
        is_text = tokens >= n
        cache = state.cache
        if length:
            text_end = torch.where(is_text & valid, positions + 1, 0).amax(1)
            cache.image_start = torch.maximum(cache.image_start, text_end)
        rel = positions - cache.image_start[:, None]
        lm_pos = self._lm_positions(state, positions)
        need = ~is_text & valid & (rel >= 0) & ((rel + 1) % self.width == 0)  # last code of an image row

        # EOL entries go after the L tokens (attention order is set by the mask, not by layout).
        extra = int(need.sum(1).max()) if length else 0
        order = torch.sort((~need).to(torch.int8), dim=1, stable=True).indices[:, :extra]
        eol_valid = need.gather(1, order)
        ids = torch.cat([self.lm_ids(tokens), torch.full((batch, extra), self.eol_token_id, device=dev)], 1)
        pos = torch.cat([lm_pos, lm_pos.gather(1, order) + 1], 1)
        live = torch.cat([valid, eol_valid], 1)
        nodes, spec = None, None
        if tree is not None:
            spec = self._eol_tree(tree)
            base_nodes = tree_nodes.to(dev).expand(batch, length)
            src = base_nodes.gather(1, order)
            nodes = torch.cat([base_nodes, torch.where(eol_valid & (src >= 0), src + spec.num_base, -1)], 1)

        mask = state.slots.attention_mask(pos, live, nodes, spec)
        hidden = self._decode(state, pos, additive_mask(mask, self.mask_dtype()), input_ids=ids)
        state.slots.append(pos, live, nodes, spec)

        # A row-final code's next-code logits come from its EOL's output.
        pick = torch.arange(length, device=dev).expand(batch, length).clone()
        pick[need] = length + (need.long().cumsum(1) - 1)[need]
        hidden = hidden.gather(1, pick[..., None].expand(-1, -1, hidden.shape[-1]))
        return ModelOutput(logits=self.code_logits(hidden).float(), hidden=hidden if output_hidden else None)

    def _run(self, state, tokens, positions, mask4d, output_hidden):  # forward is overridden
        raise NotImplementedError

    def release(self, state, positions):
        raise NotImplementedError("Emu3's end-of-line tokens follow the code positions fed, so a placeholder "
                                  "released out of order would strand its EOL; next-set decoding does not "
                                  "support Emu3 yet")

    def crop(self, state, lengths):
        lengths = lengths.to(self.device)
        # Rolling back into the prompt: codes fed next start the image there.
        state.cache.image_start = torch.minimum(state.cache.image_start, lengths)
        super().crop(state, self._lm_positions(state, lengths[:, None])[:, 0])

    def keep(self, state, path_nodes):
        spec = state.slots.tree
        if not isinstance(spec, _EOLTree):
            raise RuntimeError("keep() needs a pending tree block")
        path_nodes = path_nodes.to(self.device)
        eol = torch.where(path_nodes >= 0, path_nodes + spec.num_base, -1)
        super().keep(state, torch.cat([path_nodes, eol], 1))

    def select_rows(self, state, rows):
        state.cache.image_start = state.cache.image_start[rows.to(self.device)]
        super().select_rows(state, rows)
