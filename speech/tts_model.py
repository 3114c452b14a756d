"""The two-level codec TTS model: a `transformers` `CsmForConditionalGeneration` (Sesame CSM's shape).

A backbone transformer reads the text and then one embedding per audio frame (the sum of the frame's K code
embeddings) and predicts codebook 0 of the next frame; a small **depth decoder** then emits codebooks
1 … K−1 of that frame one by one, its position 0 fed the backbone's last hidden state, each later position fed
the previous code through *that position's* embedding table, and each position scored by *its own* head
(`CsmCodebooksHead.weight[position − 1]`). That is the shape of Qwen3-TTS's code predictor and Moshi's
depformer, and the depth decoder's K−1 sequential calls per frame are what RVQ speculation (`rvq_spec`)
shortens. Using the `transformers` class means the same pipeline code runs real CSM weights.

The bundled model's text is characters (`CharTokenizer`): ``<s> c h a r s </s>`` then the frames. Codebook 0
has one extra entry, `end of speech` (= codebook_size), which the backbone emits after the last frame; the
depth decoder's logits for it are masked, since only codes 0 … codebook_size−1 exist below level 0.

`DepthDecoderAR` exposes the depth decoder to the core as an `ARModel`: tokens at explicit per-row positions
(rows of a batch may be at different depths after ragged acceptance), position-indexed embeddings and heads,
a KV cache reset every frame. `CSM`'s own forward cannot do that: it derives positions from the cache length
and applies one head per call.
"""

from __future__ import annotations

import torch

from ..common.model import ARModel, DecodeState, ModelOutput, hf_cache_kwarg, left_align, map_dynamic_cache
from ..common.slots import SlotTable


def tiny_csm_config(num_codebooks: int = 8, codebook_size: int = 1024, text_vocab_size: int = 31,
                    hidden_size: int = 256, num_layers: int = 6, num_heads: int = 4, intermediate_size: int = 768,
                    depth_hidden_size: int = 256, depth_layers: int = 3, depth_heads: int = 4,
                    depth_intermediate_size: int = 768, max_positions: int = 1024):
    """A small `CsmConfig` (the bundled TTS model's shape). The vocabulary of every level is codebook_size + 1:
    the extra entry is end of speech (codebook 0 only).

    CSM embeds a codec model of its own (`codec_config`, Mimi by default). mmspec keeps the codec apart
    (`TTSPipeline(codec=...)`), so the bundled model carries a minimal Mimi that is never used: a few
    thousand parameters, there only so the class builds.
    """
    from transformers import CsmConfig, CsmDepthDecoderConfig, MimiConfig

    vocab = codebook_size + 1
    depth = CsmDepthDecoderConfig(num_codebooks=num_codebooks, backbone_hidden_size=hidden_size, vocab_size=vocab,
                                  hidden_size=depth_hidden_size, intermediate_size=depth_intermediate_size,
                                  num_hidden_layers=depth_layers, num_attention_heads=depth_heads,
                                  num_key_value_heads=depth_heads, max_position_embeddings=num_codebooks + 1)
    unused_codec = MimiConfig(hidden_size=16, num_filters=4, num_residual_layers=1, upsampling_ratios=[2, 2],
                              codebook_size=8, codebook_dim=8, vector_quantization_hidden_dimension=8,
                              num_quantizers=2, num_semantic_quantizers=1, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=2, head_dim=8, intermediate_size=16,
                              upsample_groups=16, sliding_window=8)
    return CsmConfig(num_codebooks=num_codebooks, vocab_size=vocab, text_vocab_size=text_vocab_size,
                     hidden_size=hidden_size, intermediate_size=intermediate_size, num_hidden_layers=num_layers,
                     num_attention_heads=num_heads, num_key_value_heads=num_heads,
                     max_position_embeddings=max_positions, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                     audio_token_id=3, audio_eos_token_id=4, codebook_eos_token_id=codebook_size,
                     codebook_pad_token_id=codebook_size, depth_decoder_config=depth.to_dict(),
                     codec_config=unused_codec.to_dict())


def end_of_speech_id(model) -> int:
    """The codebook-0 id the backbone emits after the last frame."""
    return int(model.config.codebook_eos_token_id)


def text_embeddings(model, text_ids: torch.Tensor) -> torch.Tensor:
    return model.embed_text_tokens(text_ids)


def frame_embeddings(model, codes: torch.Tensor) -> torch.Tensor:
    """codes [B, T, K] -> [B, T, H]: the sum of each frame's K code embeddings (the backbone's input)."""
    return model.backbone_model.embed_tokens(codes)


def backbone_forward(model, embeds: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor, cache,
                     output_attentions: bool = False):
    """The backbone over input embeddings [B, L, H] with a 2-D padding mask [B, S+L] and positions [B, L]."""
    kwargs = {hf_cache_kwarg(model.backbone_model): cache}
    return model.backbone_model(inputs_embeds=embeds, attention_mask=attention_mask, position_ids=positions,
                                use_cache=cache is not None, output_attentions=output_attentions, **kwargs)


class RVQDepthModel(ARModel):
    """What RVQ speculation (`rvq_spec`) needs of a depth decoder besides the `ARModel` protocol: its shape,
    and each code level's own output head applied to any hidden state (drafting code s+d from the state at
    depth s reuses the frozen head of level s+d).

    Positions: position 0 holds the backbone state; position p >= 1 is fed code p−1 and its output is the
    distribution of code p (levels 1 … num_codebooks−1). The prompt (position 0 and code 0) is run together
    with the first decode call, as the reference implementations' own `generate` does ([state, code 0] in
    one forward): `prefill` only records it, so a frame costs num_codebooks − 1 calls under plain AR.
    """

    num_codebooks: int  # K: code levels per frame, level 0 (the backbone's) included
    codebook_size: int  # codes per level; ids >= codebook_size are never emitted below level 0
    hidden_size: int  # width of the states `code_logits` scores

    def code_logits(self, hidden: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
        """hidden [N, D], levels [N] long in 1..K−1 -> [N, V] float32 logits of each row's level by that level's
        own head (ids >= codebook_size at -inf)."""
        raise NotImplementedError

    # --- what depth decoders built from `transformers` layers share ------------------------------
    # (subclasses set self.model (with .model.layers / .rotary_emb / .norm), self.config, self.device and
    # self.backbone_hidden [B, H], the state fed at position 0)
    def mask_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def new_state(self, batch_size: int) -> DecodeState:
        from transformers import DynamicCache

        if batch_size != self.backbone_hidden.shape[0]:
            raise ValueError(f"the depth decoder was given {self.backbone_hidden.shape[0]} backbone states for "
                             f"{batch_size} rows")
        return DecodeState(cache=DynamicCache(config=self.config), slots=SlotTable.empty(batch_size, self.device),
                           extra={"hidden": self.backbone_hidden})

    def run_layers(self, state: DecodeState, x: torch.Tensor, positions: torch.Tensor, mask4d) -> torch.Tensor:
        """The decoder layers and final norm over input embeddings x [B, L, H] (KV appended to the cache)."""
        inner = self.model.model
        rotary = inner.rotary_emb(x, positions)
        if "_cache_kwarg" not in self.__dict__:  # inspect once per adapter, not per call
            self._cache_kwarg = hf_cache_kwarg(inner.layers[0])
        for layer in inner.layers:
            x = layer(x, attention_mask=mask4d.to(self.device), position_ids=positions, use_cache=True,
                      position_embeddings=rotary, **{self._cache_kwarg: state.cache})
        return inner.norm(x)

    def _map_kv(self, state, fn):
        map_dynamic_cache(state.cache, fn)

    # --- the deferred prompt --------------------------------------------------------------------
    def prefill(self, input_ids, attention_mask=None, output_hidden=False):
        ids, mask, _ = left_align(input_ids, attention_mask, allow_empty=True)
        state = self.new_state(ids.shape[0])
        if ids.shape[1]:
            state.extra["pending"] = (ids.to(self.device), mask.to(self.device))
        return state, None

    def forward(self, state, tokens, positions, *, token_mask=None, tree=None, tree_nodes=None,
                output_hidden=False, query_only=None):
        pending = state.extra.pop("pending", None) if state.extra else None
        if pending is None:
            return super().forward(state, tokens, positions, token_mask=token_mask, tree=tree,
                                   tree_nodes=tree_nodes, output_hidden=output_hidden, query_only=query_only)
        ids, mask = pending
        n = ids.shape[1]
        device = tokens.device
        ids, mask = ids.to(device), mask.to(device)
        out = super().forward(
            state, torch.cat([ids, tokens], 1),
            torch.cat([(mask.long().cumsum(1) - 1).clamp(min=0), positions.to(device)], 1),
            token_mask=torch.cat([mask, torch.ones_like(tokens, dtype=torch.bool) if token_mask is None
                                  else token_mask.to(device)], 1),
            tree=tree, tree_nodes=None if tree_nodes is None else torch.cat(
                [torch.full((n,), -1, dtype=torch.long), tree_nodes.cpu()]),
            output_hidden=output_hidden,
            query_only=None if query_only is None else torch.cat([torch.zeros_like(mask), query_only.to(device)], 1))
        return ModelOutput(logits=out.logits[:, n:], hidden=None if out.hidden is None else out.hidden[:, n:])

    def select_rows(self, state, rows):
        if state.extra and "pending" in state.extra:
            ids, mask = state.extra["pending"]
            state.extra["pending"] = (ids[rows.to(ids.device)], mask[rows.to(ids.device)])
        if state.extra and "hidden" in state.extra:
            state.extra["hidden"] = state.extra["hidden"].index_select(0, rows.to(state.extra["hidden"].device))
        super().select_rows(state, rows)


class DepthDecoderAR(RVQDepthModel):
    """A CSM depth decoder for one frame of a batch, as an `ARModel` (see the module docstring).

    Position 0 is the backbone's hidden state (`backbone_hidden` [B, H], whatever token is fed there);
    position p >= 1 is fed code p−1 through table p−1 and its output, scored by head p−1, is the distribution
    of code p. Logits of ids >= codebook_size (end of speech) are -inf.
    """

    def __init__(self, depth_decoder, backbone_hidden: torch.Tensor, codebook_size: int):
        self.model = depth_decoder
        self.config = depth_decoder.config
        self.vocab_size = self.config.vocab_size
        self.codebook_size = codebook_size
        self.num_codebooks = self.config.num_codebooks
        self.hidden_size = self.config.hidden_size
        self.device = backbone_hidden.device
        self.backbone_hidden = backbone_hidden

    def embed(self, state: DecodeState, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        inner = self.model.model
        table = (positions - 1).clamp(0, self.num_codebooks - 2)
        embeds = inner.embed_tokens(tokens.clamp(0, self.vocab_size - 1) + table * self.vocab_size)
        hidden = state.extra["hidden"].to(embeds.dtype)[:, None, :].expand_as(embeds)
        return torch.where((positions == 0)[..., None], hidden, embeds)

    def code_logits(self, hidden: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
        weight = self.model.codebooks_head.weight  # [K-1, D, V]; head j scores level j + 1
        logits = hidden.new_zeros(hidden.shape[0], weight.shape[-1])
        # One matmul per level present (at most K−1), not a [N, D, V] gather of every row's head.
        for level in levels.unique().tolist():
            rows = levels == level
            logits[rows] = hidden[rows] @ weight[level - 1]
        logits = logits.float()
        logits[..., self.codebook_size:] = float("-inf")
        return logits

    def head_logits(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """[B, L, D] depth-decoder states at `positions` -> [B, L, V] logits by each position's own head.
        Position 0's output predicts nothing the depth decoder emits; positions past the last level (padding
        a verify pass feeds at clamped positions) are scored by the last head, and never used."""
        levels = positions.clamp(1, self.num_codebooks - 1).reshape(-1)
        logits = self.code_logits(hidden.reshape(-1, hidden.shape[-1]), levels).view(*hidden.shape[:2], -1)
        return logits.masked_fill((positions == 0)[..., None], 0.0).masked_fill_(
            torch.arange(logits.shape[-1], device=logits.device) >= self.codebook_size, float("-inf"))

    def _run(self, state, tokens, positions, mask4d, output_hidden):
        tokens, positions = tokens.to(self.device), positions.to(self.device)
        x = self.model.model.inputs_embeds_projector(self.embed(state, tokens, positions))
        x = self.run_layers(state, x, positions, mask4d)
        return ModelOutput(logits=self.head_logits(x, positions), hidden=x if output_hidden else None)

    def token_embeddings(self) -> torch.Tensor:
        raise NotImplementedError("the depth decoder embeds each code with its position's table; use embed()")


def _dropout(x: torch.Tensor, p: float, generator) -> torch.Tensor:
    """Inverted dropout drawing its mask from `generator` (so a resumed run draws the same masks)."""
    keep = torch.rand(x.shape, generator=generator).to(x.device) >= p
    return x * keep.to(x.dtype) / (1 - p)


def training_losses(model, text_ids: torch.Tensor, text_lengths: torch.Tensor, codes: torch.Tensor,
                    frame_lengths: torch.Tensor, *, depth_fraction: float = 0.25, guided_layers=None,
                    guided_heads=(0, 1), guided_sigma: float = 0.2, frame_dropout: float = 0.0,
                    generator: torch.Generator | None = None) -> dict:
    """Losses of one batch: backbone cross-entropy on codebook 0 (end of speech included), depth-decoder
    cross-entropy on codebooks 1..K−1 of a random `depth_fraction` of frames (CSM's amortisation), and a
    guided-attention loss that pulls `guided_heads` of `guided_layers` onto the text near the diagonal.

    text_ids [B, S] right-padded (<s> … </s>), codes [B, T, K] right-padded, lengths per row.

    Why guided attention: a decoder-only TTS must discover the text-to-audio alignment by itself, which a small
    model on two CPU cores learns too slowly; DCTTS-style diagonal guidance on a few heads makes it appear in
    a few hundred steps, and the heads stay free to sharpen it. Those heads are also told to look at text only.
    """
    import torch.nn.functional as F

    num_layers = model.config.num_hidden_layers
    if guided_layers is None:  # the second and third layers (the first sees only embeddings)
        guided_layers = tuple(layer for layer in (1, 2) if layer < num_layers) or (0,)
    if any(not 0 <= layer < num_layers for layer in guided_layers):
        raise ValueError(f"guided_layers must name layers in 0..{num_layers - 1}, got {guided_layers!r}")
    batch, num_text = text_ids.shape
    num_frames, depth = codes.shape[1], codes.shape[2]
    device = codes.device
    eos = end_of_speech_id(model)
    # Sequence per row: its text, then its frames, then padding: [B, S + T].
    length = text_lengths + frame_lengths
    total = int(length.max())
    index = torch.arange(total, device=device)[None]
    is_text = index < text_lengths[:, None]
    is_frame = (index >= text_lengths[:, None]) & (index < length[:, None])
    text_index = index.clamp(max=num_text - 1).expand(batch, -1)
    frame_index = (index - text_lengths[:, None]).clamp(0, num_frames - 1)
    text_part = text_embeddings(model, text_ids.gather(1, text_index))
    frame_part = frame_embeddings(model, codes.gather(1, frame_index[..., None].expand(-1, -1, depth)))
    if frame_dropout and model.training:
        frame_part = _dropout(frame_part, frame_dropout, generator)
    embeds = torch.where(is_text[..., None], text_part, torch.where(is_frame[..., None], frame_part, 0.0))
    valid = index < length[:, None]
    positions = index.expand(batch, -1)
    out = backbone_forward(model, embeds, valid.long(), positions, None, output_attentions=bool(guided_layers))
    hidden = out.last_hidden_state  # [B, L, H]

    # Backbone: the position before frame t predicts cb0 of frame t; the last frame predicts end of speech.
    predicts = (index >= text_lengths[:, None] - 1) & (index < length[:, None])
    target_frame = index - text_lengths[:, None] + 1  # frame predicted from each position
    cb0 = codes[..., 0].gather(1, target_frame.clamp(0, num_frames - 1))
    cb0 = torch.where(target_frame >= frame_lengths[:, None], torch.full_like(cb0, eos), cb0)
    logits = model.lm_head(hidden[predicts]).float()
    backbone_loss = F.cross_entropy(logits, cb0[predicts])

    # Depth decoder on a random subset of real frames.
    rows, frames = (index[0][None] < frame_lengths[:, None].clamp(max=num_frames)).nonzero(as_tuple=True)
    rows, frames = rows[frames < num_frames], frames[frames < num_frames]
    keep = torch.rand(rows.numel(), generator=generator).to(device) < depth_fraction
    rows, frames = rows[keep], frames[keep]
    depth_loss = hidden.new_zeros(())
    if rows.numel():
        h = hidden[rows, text_lengths[rows] - 1 + frames]  # [M, H]
        frame_codes = codes[rows, frames]  # [M, K]
        inner = model.depth_decoder.model
        vocab = model.depth_decoder.config.vocab_size
        offsets = torch.arange(depth - 1, device=device) * vocab
        code_embeds = inner.embed_tokens(frame_codes[:, :-1] + offsets)  # codes 0..K-2 at positions 1..K-1
        inputs = torch.cat([h[:, None], code_embeds], 1)
        depth_out = model.depth_decoder(inputs_embeds=inputs)
        depth_logits = depth_out.logits.float()  # [M, K-1, V] (position 0 dropped)
        depth_loss = F.cross_entropy(depth_logits.reshape(-1, vocab), frame_codes[:, 1:].reshape(-1))

    guided = hidden.new_zeros(())
    if guided_layers:
        query_frame = (index - text_lengths[:, None]).float()  # [B, L]
        key = torch.arange(total, device=device)[None].float()
        prior = 1 - torch.exp(-((key[:, None, :] / text_lengths[:, None, None]
                                 - query_frame[..., None] / frame_lengths[:, None, None]) ** 2)
                              / (2 * guided_sigma ** 2))  # [B, Lq, Lk]
        penalty = torch.where(is_text[:, None, :], prior, torch.ones_like(prior))
        queries = is_frame[..., None].float()
        for layer in guided_layers:
            attention = out.attentions[layer][:, list(guided_heads)].float()  # [B, h, Lq, Lk]
            guided = guided + ((attention * penalty[:, None]).sum(-1) * queries[:, None, :, 0]).sum() / \
                (queries.sum() * len(guided_heads))
        guided = guided / len(guided_layers)
    return {"loss": backbone_loss + depth_loss + guided, "backbone": backbone_loss, "depth": depth_loss,
            "guided_attention": guided}
