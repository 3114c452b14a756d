"""The bundled ASR model: a Conformer encoder with a CTC head and an attention decoder over its output.

The decoder plays the "speech-aware LM" of the self-speculative ASR paper: it is the heavy part (about
twice the encoder's parameters), so autoregressive decoding dominates the cost as it does with a 1B LLM
verifier, and a CTC hypothesis verified in one decoder pass saves most of it. Both heads share the
`CharTokenizer` vocabulary (blank = padding = 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torchaudio
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from ..common.model import ARModel, DecodeState, ModelOutput
from ..common.slots import SlotTable

SAMPLE_RATE = 16_000
HOP_LENGTH = 160  # 10 ms frames


class LogMel(nn.Module):
    """16 kHz waveform [B, N] -> log-mel features [B, T, n_mels] (25 ms window, 10 ms hop)."""

    def __init__(self, n_mels: int = 80):
        super().__init__()
        self.mel = torchaudio.transforms.MelSpectrogram(SAMPLE_RATE, n_fft=400, win_length=400,
                                                        hop_length=HOP_LENGTH, n_mels=n_mels)

    def forward(self, waves: torch.Tensor) -> torch.Tensor:
        with torch.autocast(waves.device.type, enabled=False):
            return torch.log(self.mel(waves.float()) + 1e-6).transpose(1, 2)

    @staticmethod
    def num_frames(num_samples: torch.Tensor) -> torch.Tensor:
        return num_samples // HOP_LENGTH + 1


@dataclass
class EncoderOutput:
    ctc_logits: torch.Tensor  # [B, T, V] float32 CTC logits (blank = 0)
    memory: torch.Tensor  # [B, T, D] encoder states projected to the decoder width
    lengths: torch.Tensor  # [B] long valid frames per row


class DecoderLayer(nn.Module):
    """Pre-norm transformer decoder layer: causal self-attention (cached), cross-attention, MLP."""

    def __init__(self, dim: int, heads: int, ffn: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.norm_self, self.norm_cross, self.norm_mlp = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.self_out = nn.Linear(dim, dim)
        self.cross_q = nn.Linear(dim, dim)
        self.cross_kv = nn.Linear(dim, 2 * dim)
        self.cross_out = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))
        self.dropout = dropout

    def _split(self, x):
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def cross_keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.cross_kv(memory).chunk(2, -1)
        return self._split(k), self._split(v)

    def forward(self, x, self_mask, cross_kv, cross_mask, cache: list | None):
        """x [B, L, D]; self_mask additive [B, 1, L, S+L] (or None = causal); cache [K, V] grows in place."""
        drop = self.dropout if self.training else 0.0
        q, k, v = (self._split(t) for t in self.qkv(self.norm_self(x)).chunk(3, -1))
        if cache is not None:
            if cache[0] is not None:
                k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
            cache[0], cache[1] = k, v
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=self_mask, is_causal=self_mask is None, dropout_p=drop)
        x = x + self.self_out(a.transpose(1, 2).flatten(2))
        q = self._split(self.cross_q(self.norm_cross(x)))
        a = F.scaled_dot_product_attention(q, cross_kv[0], cross_kv[1], attn_mask=cross_mask, dropout_p=drop)
        x = x + self.cross_out(a.transpose(1, 2).flatten(2))
        return x + F.dropout(self.mlp(self.norm_mlp(x)), drop, self.training)


class ASRModel(ModelMixin, ConfigMixin):
    """Log-mel -> conv subsampling (4×, 25 frames/s) -> Conformer -> CTC head; attention decoder on top."""

    @register_to_config
    def __init__(self, vocab_size: int = 31, n_mels: int = 80, encoder_dim: int = 144, encoder_layers: int = 4,
                 encoder_heads: int = 4, encoder_ffn: int = 576, conv_kernel: int = 15, decoder_dim: int = 256,
                 decoder_layers: int = 4, decoder_heads: int = 4, decoder_ffn: int = 1024,
                 max_text_positions: int = 256, dropout: float = 0.1):
        super().__init__()
        self.features = LogMel(n_mels)
        self.register_buffer("feature_mean", torch.zeros(n_mels))
        self.register_buffer("feature_std", torch.ones(n_mels))
        self.subsample = nn.Sequential(
            nn.Conv1d(n_mels, encoder_dim, 3, stride=2, padding=1), nn.GELU(),
            nn.Conv1d(encoder_dim, encoder_dim, 3, stride=2, padding=1), nn.GELU())
        self.conformer = torchaudio.models.Conformer(
            input_dim=encoder_dim, num_heads=encoder_heads, ffn_dim=encoder_ffn, num_layers=encoder_layers,
            depthwise_conv_kernel_size=conv_kernel, dropout=dropout)
        # Padded frames must not reach valid ones, so a batch transcribes exactly like its rows one by one:
        # attention masks them, and the depthwise convolutions see zeros there (as at a lone row's edge).
        self._valid_frames: torch.Tensor | None = None
        for layer in self.conformer.conformer_layers:
            layer.conv_module.sequential[2].register_forward_pre_hook(self._zero_padded_frames)
        self.ctc_head = nn.Linear(encoder_dim, vocab_size)
        self.memory_proj = nn.Linear(encoder_dim, decoder_dim)
        self.embed = nn.Embedding(vocab_size, decoder_dim)
        self.positions = nn.Embedding(max_text_positions, decoder_dim)
        self.layers = nn.ModuleList(DecoderLayer(decoder_dim, decoder_heads, decoder_ffn, dropout)
                                    for _ in range(decoder_layers))
        self.final_norm = nn.LayerNorm(decoder_dim)
        self.lm_head = nn.Linear(decoder_dim, vocab_size)
        sinusoid_init_(self.positions)

    # ------------------------------------------------------------------------------------------ encoder
    def log_mel(self, waves: torch.Tensor, num_samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """waves [B, N] float (16 kHz, zero padded), num_samples [B] -> normalised features [B, T, M], lengths.

        Row by row on the unpadded audio: the STFT's edge padding then matches a lone utterance's."""
        rows = [(self.features(waves[b:b + 1, : int(n)])[0] - self.feature_mean) / self.feature_std
                for b, n in enumerate(num_samples.tolist())]
        return nn.utils.rnn.pad_sequence(rows, batch_first=True), LogMel.num_frames(num_samples)

    @staticmethod
    def _valid(lengths: torch.Tensor, total: int) -> torch.Tensor:
        return torch.arange(total, device=lengths.device)[None, :] < lengths[:, None]

    def _zero_padded_frames(self, module, args):
        if self._valid_frames is None:
            return None
        return (args[0] * self._valid_frames[:, None, :].to(args[0].dtype),)

    def encode_features(self, feats: torch.Tensor, lengths: torch.Tensor) -> EncoderOutput:
        """feats [B, T, M] normalised log-mel, lengths [B] -> CTC logits and decoder memory at 25 frames/s."""
        x = (feats * self._valid(lengths, feats.shape[1])[..., None].to(feats.dtype)).transpose(1, 2)
        for conv in (self.subsample[0], self.subsample[2]):  # stride 2, kernel 3, padding 1: ceil(T / 2)
            lengths = (lengths + 1) // 2
            x = F.gelu(conv(x))
            x = x * self._valid(lengths, x.shape[2])[:, None, :].to(x.dtype)
        x = x.transpose(1, 2)
        lengths = lengths.clamp(min=1, max=x.shape[1])
        self._valid_frames = self._valid(lengths, x.shape[1])
        try:
            x, lengths = self.conformer(x, lengths)
        finally:
            self._valid_frames = None
        return EncoderOutput(ctc_logits=self.ctc_head(x).float(), memory=self.memory_proj(x), lengths=lengths)

    def encode(self, waves: torch.Tensor, num_samples: torch.Tensor) -> EncoderOutput:
        return self.encode_features(*self.log_mel(waves, num_samples))

    # ------------------------------------------------------------------------------------------ decoder
    def cross_keys_values(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.cross_keys_values(memory) for layer in self.layers]

    def decode(self, tokens, positions, cross_kv, cross_mask, self_mask=None, caches=None):
        """tokens, positions [B, L]; cross_mask additive [B, 1, 1, T]; -> (logits [B, L, V], hidden [B, L, D])."""
        x = self.embed(tokens) + self.positions(positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, self_mask, cross_kv[i], cross_mask, None if caches is None else caches[i])
        hidden = self.final_norm(x)
        return self.lm_head(hidden), hidden

    def forward(self, feats, feat_lengths, decoder_input, decoder_positions=None):
        """Training pass: (encoder output, decoder logits [B, L, V]) with teacher forcing and a causal mask."""
        enc = self.encode_features(feats, feat_lengths)
        if decoder_positions is None:
            decoder_positions = torch.arange(decoder_input.shape[1], device=decoder_input.device).expand_as(
                decoder_input)
        cross_mask = memory_mask(enc.lengths, enc.memory.shape[1], enc.memory.dtype)
        logits, _ = self.decode(decoder_input, decoder_positions, self.cross_keys_values(enc.memory), cross_mask)
        return enc, logits


def memory_mask(lengths: torch.Tensor, total: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive [B, 1, 1, T] mask hiding encoder frames past each row's length."""
    valid = torch.arange(total, device=lengths.device)[None, :] < lengths[:, None]
    mask = torch.zeros(valid.shape, dtype=dtype, device=lengths.device).masked_fill(~valid, torch.finfo(dtype).min)
    return mask[:, None, None, :]


class ASRDecoderAdapter(ARModel):
    """The attention decoder as an `ARModel`, conditioned on one encoder output per batch row.

    The cross-attention keys and values are computed once per utterance and follow `select_rows`; the
    self-attention KV cache is the core's (crop, ragged rows), so a verify pass's cache is reused by the
    autoregressive continuation.
    """

    def __init__(self, model: ASRModel, encoder_output: EncoderOutput, compact_slack: int = 64):
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.device = encoder_output.memory.device
        self.compact_slack = compact_slack
        self._cross_kv = model.cross_keys_values(encoder_output.memory)
        self._cross_mask = memory_mask(encoder_output.lengths, encoder_output.memory.shape[1],
                                       encoder_output.memory.dtype)
        # Valid encoder frames per utterance, on the host: a state attends over its own rows' longest, not the
        # whole call's (with continuous batching the call can hold far longer utterances than the running rows).
        self._frames = encoder_output.lengths.tolist()
        self._prefill_requests: torch.Tensor | None = None

    @property
    def max_positions(self) -> int:
        return self.model.config.max_text_positions

    def mask_dtype(self) -> torch.dtype:
        return self._cross_mask.dtype

    def token_embeddings(self):
        return self.model.embed.weight

    def output_logits(self, hidden):
        return self.model.lm_head(hidden).float()

    def set_prefill_requests(self, requests: torch.Tensor) -> None:
        self._prefill_requests = requests

    def new_state(self, batch_size: int) -> DecodeState:
        requests = self._prefill_requests
        if requests is None or requests.numel() != batch_size:  # a prefill of the whole batch
            if batch_size != self._cross_mask.shape[0]:
                raise ValueError(f"batch of {batch_size} rows for {self._cross_mask.shape[0]} encoded utterances")
            requests = torch.arange(batch_size)
        requests = requests.to(self.device)
        frames = [self._frames[i] for i in requests.tolist()]
        width = max(frames, default=1)
        extra = {"cross_kv": [(k[requests, :, :width], v[requests, :, :width]) for k, v in self._cross_kv],
                 "cross_mask": self._cross_mask[requests, ..., :width], "frames": frames}
        return DecodeState(cache=[[None, None] for _ in self.model.layers],
                           slots=SlotTable.empty(batch_size, self.device), extra=extra)

    def _run(self, state, tokens, positions, mask4d, output_hidden):
        logits, hidden = self.model.decode(tokens.to(self.device), positions.to(self.device),
                                           state.extra["cross_kv"], state.extra["cross_mask"],
                                           mask4d.to(self.device), state.cache)
        return ModelOutput(logits=logits.float(), hidden=hidden if output_hidden else None)

    def _map_kv(self, state, fn):
        for layer in state.cache:
            if layer[0] is not None:
                layer[0], layer[1] = fn(layer[0]), fn(layer[1])

    def select_rows(self, state, rows):
        super().select_rows(state, rows)
        rows = rows.to(self.device)
        extra = state.extra
        extra["frames"] = [extra["frames"][i] for i in rows.tolist()]
        width = max(extra["frames"], default=1)  # the longest utterance may have left: attend over less
        extra["cross_kv"] = [(k[rows, :, :width], v[rows, :, :width]) for k, v in extra["cross_kv"]]
        extra["cross_mask"] = extra["cross_mask"][rows, ..., :width]

    def append_rows(self, state, other):
        """Admit the rows of `other` (a state of this adapter: newly prefilled utterances) after `state`'s."""
        was_empty = state.slots.batch_size == 0
        super().append_rows(state, other)
        mine, theirs = state.extra, other.extra
        if was_empty:
            state.extra = dict(theirs)
            return
        width = max(mine["cross_mask"].shape[-1], theirs["cross_mask"].shape[-1])

        def widen(t, dim, value=0.0):  # pad the frame axis up to `width` (padded frames are masked out)
            pad = [0, 0] * (t.dim() - 1 - dim) + [0, width - t.shape[dim]]
            return torch.nn.functional.pad(t, pad, value=value)

        blocked = torch.finfo(mine["cross_mask"].dtype).min
        mine["cross_kv"] = [(torch.cat([widen(k, 2), widen(k2, 2)]), torch.cat([widen(v, 2), widen(v2, 2)]))
                            for (k, v), (k2, v2) in zip(mine["cross_kv"], theirs["cross_kv"])]
        mine["cross_mask"] = torch.cat([widen(mine["cross_mask"], 3, blocked), widen(theirs["cross_mask"], 3, blocked)])
        mine["frames"] = mine["frames"] + theirs["frames"]


def sinusoid_init_(embedding: nn.Embedding) -> None:
    """Start learned positions from sinusoids: the decoder learns spelling faster with a sane prior."""
    n, d = embedding.weight.shape
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    with torch.no_grad():
        embedding.weight[:, 0::2] = torch.sin(pos * div)
        embedding.weight[:, 1::2] = torch.cos(pos * div)
