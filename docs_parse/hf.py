"""`ARModel` adapters for two Hugging Face document VLMs: Idefics3 (SmolDocling) and Florence-2.

The core decodes token streams; it knows nothing of pages. What it needs from a document VLM is the part
that runs once per generated token: the language model. The vision side runs once per page, ahead of
decoding, and its output is handed to the adapter, so many prompts over one page (page, layout, region
prompts; sampled rows) share one encoder pass and a decode step never pays for the vision tower.

The two models split the work differently:

* `Idefics3ForConditionalGeneration` is decoder-only. A page becomes one or more sub-images (the
  processor's image splitting: tiles plus a global view), each turned into `image_seq_len` features by a
  SigLIP tower and the pixel-shuffle connector; the prompt carries one `<image>` placeholder per feature,
  in the same order. `encode_idefics3_pages` runs that once per page and `Idefics3AR` splices a page's
  features at the placeholders of every prompt row that reads it (`row_pages`), like `PageVLMAR` does for
  GOT-OCR2.

* `Florence2ForConditionalGeneration` is an encoder-decoder: DaViT image features replace the `<image>`
  placeholders of the task prompt, and a BART encoder reads the merged sequence. `encode_florence2` runs
  both once per (page, task prompt); `Florence2AR` runs only the BART decoder, which cross-attends to
  those states. Its prompt is just the decoder start token (`Florence2AR.decoder_prompt`).

Both are built from configs in the tests (no Hub access); real checkpoints load the same classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mmspec.common.model import (ARModel, DecodeState, EncoderDecoderRows, HFCausalLM, ModelOutput, hf_cache_kwarg,
                                 map_dynamic_cache)
from mmspec.common.slots import SlotTable


def _param(model) -> torch.Tensor:
    return next(model.parameters())


# --- Idefics3 (SmolDocling) -------------------------------------------------------------------------------

def encode_idefics3_pages(model, pixel_values: torch.Tensor,
                          pixel_attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Page images -> one [N_p, D] tensor per page: the decoder-space features its `<image>` tokens take.

    pixel_values: [P, C, H, W] (one image per page) or the processor's [P, K, C, H, W] (K sub-images per page
    from image splitting; all-zero sub-images are padding and are skipped, as the model itself does).
    pixel_attention_mask: [P, H, W] or [P, K, H, W], as the processor returns it. N_p is the number of real
    sub-images of page p times the model's `image_seq_len`, so pages split into different tile counts come
    back with different lengths; that is why the result is a list rather than one tensor.
    """
    if pixel_values.ndim == 4:  # one image per page: the model's own layout has a sub-image axis
        pixel_values = pixel_values[:, None]
        if pixel_attention_mask is not None:
            pixel_attention_mask = pixel_attention_mask[:, None]
    if pixel_values.ndim != 5:
        raise ValueError(f"pixel_values must be [pages, C, H, W] or [pages, sub-images, C, H, W], "
                         f"got shape {tuple(pixel_values.shape)}")
    param = _param(model)
    if pixel_attention_mask is not None:
        pixel_attention_mask = pixel_attention_mask.to(param.device)
    out = model.model.get_image_features(pixel_values=pixel_values.to(param.device, param.dtype),
                                         pixel_attention_mask=pixel_attention_mask)
    pages = list(out.pooler_output)  # the model splits its connector output per page
    if len(pages) != pixel_values.shape[0]:
        # get_image_features drops all-zero images; a page made only of those disappears from the split.
        raise ValueError(f"{pixel_values.shape[0]} pages in, {len(pages)} encoded: a page whose pixel values are "
                         "all zero is taken for padding by Idefics3")
    return pages


class Idefics3AR(HFCausalLM):
    """`ARModel` over an Idefics3 VLM (SmolDocling's architecture) whose page features were computed once.

    page_features: one [N_p, D] tensor per page (`encode_idefics3_pages`), or a [P, N, D] tensor.
    row_pages [B]: the page each prompt row reads; several rows may read one page.

    Each row reads exactly one page, all of its sub-images: its prompt must hold N_p `<image>` tokens
    (before its last token, which the core feeds with the first decode step). They are filled on the forward
    that first feeds them, in order, as the model's own `inputs_merger` does. After that a row's image is
    placed, and an `<image>` id the model itself generates is embedded as a plain token, as in its own
    `generate` (which passes pixel values to the first forward only).
    """

    def __init__(self, model, page_features: Sequence[torch.Tensor] | torch.Tensor, row_pages: torch.Tensor,
                 compact_slack: int = 64):
        super().__init__(model, compact_slack)
        self.text_model = model.model.text_model
        self._cache_kwarg = hf_cache_kwarg(self.text_model)
        self.lm_head = model.lm_head
        self.image_token_id = model.config.image_token_id
        self.page_features = [f.to(self.device) for f in page_features]
        self.page_lengths = torch.tensor([f.shape[0] for f in self.page_features], device=self.device)
        self.row_pages = row_pages.to(self.device).long()
        if self.row_pages.ndim != 1 or bool(((self.row_pages < 0) | (self.row_pages >= len(self.page_features))).any()):
            raise ValueError(f"row_pages must be [rows] indices into the {len(self.page_features)} pages, "
                             f"got {row_pages.tolist()}")

    def new_state(self, batch_size: int) -> DecodeState:
        from transformers import DynamicCache

        if batch_size != self.row_pages.shape[0]:
            raise ValueError(f"batch of {batch_size} rows for row_pages of {self.row_pages.shape[0]}")
        state = DecodeState(cache=DynamicCache(config=self.config.text_config),
                            slots=SlotTable.empty(batch_size, self.device))
        state.extra = {"rows": torch.arange(batch_size, device=self.device),  # this state's rows -> row_pages
                       "image_placed": torch.zeros(batch_size, dtype=torch.bool, device=self.device)}
        return state

    def prefill(self, input_ids, attention_mask=None, output_hidden=False):
        state, out = super().prefill(input_ids, attention_mask, output_hidden)
        missing = (~state.extra["image_placed"]).nonzero().flatten().tolist()
        if missing:
            # Decoding on would read the page nowhere: a prompt without its image is a caller's mistake.
            raise ValueError(f"rows {missing} have no <image> tokens in their prompt (before its last token); "
                             "each row must carry the placeholders of the page it reads")
        return state, out

    def _run(self, state, tokens, positions, mask4d, output_hidden):
        tokens = tokens.to(self.device)
        embeds = self.text_model.get_input_embeddings()(tokens)
        placeholders = (tokens == self.image_token_id) & ~state.extra["image_placed"][:, None]
        if bool(placeholders.any()):
            counts = placeholders.sum(1)
            pages = self.row_pages[state.extra["rows"]]
            expected = self.page_lengths[pages]
            filling = counts > 0
            if bool((filling & (counts != expected)).any()):
                raise ValueError(
                    f"each row's prompt must hold exactly as many <image> tokens as its page has features "
                    f"(sub-images × image_seq_len), all fed in one forward; one page per row. Expected "
                    f"{expected[filling].tolist()}, got {counts[filling].tolist()}")
            # masked_scatter fills row-major, so the rows' features go in row order.
            feats = torch.cat([self.page_features[p] for p in pages[filling].tolist()])
            embeds = embeds.masked_scatter(placeholders[..., None], feats.to(embeds.dtype))
            state.extra["image_placed"] = state.extra["image_placed"] | filling
        out = self.text_model(inputs_embeds=embeds, position_ids=positions.to(self.device),
                              attention_mask=mask4d.to(self.device), use_cache=True,
                              **{self._cache_kwarg: state.cache})
        hidden = out.last_hidden_state
        return ModelOutput(logits=self.lm_head(hidden).float(), hidden=hidden if output_hidden else None)

    def select_rows(self, state, rows):
        rows_here = rows.to(self.device)
        state.extra["rows"] = state.extra["rows"][rows_here]
        state.extra["image_placed"] = state.extra["image_placed"][rows_here]
        super().select_rows(state, rows)

    def _map_kv(self, state, fn):
        map_dynamic_cache(state.cache, fn)


# --- Florence-2 -------------------------------------------------------------------------------------------

def encode_florence2(model, pixel_values: torch.Tensor, input_ids: torch.Tensor,
                     attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run Florence-2's encoder side once: -> (encoder states [E, S, D], encoder mask [E, S] bool).

    pixel_values [E, C, H, W] and the processor's task prompts input_ids / attention_mask [E, S] (one image
    per prompt; its `<image>` placeholders come first in the processor's prompts). The image features
    replace the placeholders, then the BART encoder reads the merged sequence, as the model's generate does.
    """
    param = _param(model)
    input_ids = input_ids.to(param.device)
    attention_mask = (torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(param.device))
    embeds = model.get_input_embeddings()(input_ids)
    features = model.model.get_image_features(pixel_values=pixel_values.to(param.device, param.dtype)).pooler_output
    placeholders = input_ids == model.config.image_token_id
    counts = placeholders.sum(1)
    if features.shape[0] != input_ids.shape[0] or bool((counts != features.shape[1]).any()):
        raise ValueError(f"each prompt needs exactly {features.shape[1]} <image> tokens for its one image "
                         f"({features.shape[0]} images, {input_ids.shape[0]} prompts); got {counts.tolist()}")
    embeds = embeds.masked_scatter(placeholders[..., None], features.to(embeds.dtype))
    states = model.model.language_model.encoder(inputs_embeds=embeds, attention_mask=attention_mask).last_hidden_state
    return states, attention_mask.bool()


class Florence2AR(EncoderDecoderRows, ARModel):
    """`ARModel` over Florence-2's BART decoder, cross-attending to precomputed encoder states.

    The layers are driven here rather than through `BartDecoder.forward`, because that forward derives
    every row's positions from the cache length: with ragged rows (and the core's dead cache slots) the
    cache length is not each row's position. Token embedding, learned positions (BART's offset of 2),
    `layernorm_embedding` and the layers are the decoder's own modules. Dropout is not applied: the adapter
    is for inference.
    """

    def __init__(self, model, encoder_states: torch.Tensor, encoder_mask: torch.Tensor | None = None,
                 compact_slack: int = 64):
        self.model = model
        self.decoder = model.model.language_model.decoder
        self.config = model.config.text_config
        self.lm_head = model.lm_head
        self.vocab_size = self.lm_head.weight.shape[0]
        self.device = encoder_states.device
        self.compact_slack = compact_slack
        self.max_positions = self.decoder.embed_positions.num_embeddings - self.decoder.embed_positions.offset
        start = getattr(model.generation_config, "decoder_start_token_id", None)
        self.decoder_start_token_id = self.config.decoder_start_token_id if start is None else start
        self._cache_kwarg = hf_cache_kwarg(self.decoder.layers[0])
        self._encoder_states = encoder_states
        if encoder_mask is not None and encoder_mask.shape != encoder_states.shape[:2]:
            raise ValueError(f"encoder_mask {tuple(encoder_mask.shape)} does not match encoder states "
                             f"{tuple(encoder_states.shape[:2])}")
        # An all-valid encoder needs no cross-attention mask; leaving it out keeps attention on its unmasked path.
        all_valid = encoder_mask is None or bool(encoder_mask.all())
        self._encoder_mask = None if all_valid else encoder_mask.bool().to(self.device)

    def decoder_prompt(self) -> torch.Tensor:
        """[E, 1] the decoder start token for every encoded row: the prompt to decode from."""
        return torch.full((self._encoder_states.shape[0], 1), self.decoder_start_token_id, dtype=torch.long)

    def mask_dtype(self):
        return _param(self.model).dtype

    def token_embeddings(self):
        embed = self.decoder.embed_tokens
        return embed.weight[: self.vocab_size] * getattr(embed, "embed_scale", 1.0)

    def output_logits(self, hidden):
        return self.lm_head(hidden).float()

    def input_embedding_module(self):
        return self.decoder.embed_tokens

    def new_state(self, batch_size):
        from transformers import DynamicCache, EncoderDecoderCache

        if batch_size != self._encoder_states.shape[0]:
            raise ValueError(f"batch of {batch_size} rows for {self._encoder_states.shape[0]} encoded prompts")
        return DecodeState(cache=EncoderDecoderCache(DynamicCache(), DynamicCache()),
                           slots=SlotTable.empty(batch_size, self.device),
                           extra={"encoder_states": self._encoder_states, "encoder_mask": self._encoder_mask})

    def _cross_attention_mask(self, state) -> torch.Tensor | None:
        keep = state.extra["encoder_mask"]
        if keep is None:
            return None
        dtype = self.mask_dtype()
        blocked = torch.zeros(keep.shape, dtype=dtype, device=self.device).masked_fill(~keep, torch.finfo(dtype).min)
        return blocked[:, None, None, :]  # [B, 1, 1, S]: the same for every query

    def _run(self, state, tokens, positions, mask4d, output_hidden):
        positions = positions.to(self.device)
        pos_embed = self.decoder.embed_positions
        # Called as a plain embedding: the module's own forward adds a leading axis to given position_ids.
        hidden = self.decoder.embed_tokens(tokens.to(self.device)) + torch.nn.functional.embedding(
            positions + pos_embed.offset, pos_embed.weight)
        hidden = self.decoder.layernorm_embedding(hidden)
        cross_mask = self._cross_attention_mask(state)
        for layer in self.decoder.layers:
            hidden = layer(hidden, mask4d.to(self.device), state.extra["encoder_states"],
                           encoder_attention_mask=cross_mask, use_cache=True,
                           **{self._cache_kwarg: state.cache})
        return ModelOutput(logits=self.lm_head(hidden).float(), hidden=hidden if output_hidden else None)

