"""`HFCodec`: a user's Hugging Face audio codec (`DacModel`, `EncodecModel`, `MimiModel`) as the TTS pipeline's codec.

    from transformers import MimiModel
    codec = HFCodec(MimiModel.from_pretrained("kyutai/mimi"), num_codebooks=8)
    codes, frame_lengths = codec.encode(waves, lengths)        # [B, 8, T], [B]
    waves, lengths = codec.decode(codes, frame_lengths)        # [B, T * 1920], [B]

It answers the same protocol as the bundled codec (see `mmspec.speech.codec`). The three models differ in how
they are called, which this adapter hides:

- DAC: ``encode(x, n_quantizers=K)``; codes ``[B, K, T]``; ``decode(audio_codes=...)`` gives ``[B, N]``.
- EnCodec: the quantizer count follows a bandwidth from ``config.target_bandwidths``; codes come as
  ``[chunks, B, K, T]``. Residual VQ codes are prefix-consistent (codebook k does not depend on how many follow
  it), so K codebooks are the first K at the smallest bandwidth that gives at least K.
- Mimi: ``encode(x, num_quantizers=K)``, codes ``[B, K, T]``; the first ``num_semantic_quantizers`` codebooks
  are semantic and cannot be dropped.

Rows are padded with zeros to whole code frames: ``frame_lengths = ceil(length / hop)`` and decoded rows are
``frame_lengths * hop`` samples, zeros after that. A causal codec (Mimi, EnCodec with causal convolutions) runs a
batch at once, since right padding cannot reach earlier frames. DAC is not causal: padding would change the last
frames of the shorter rows, so rows of different lengths run separately (rows of equal length share a batch) and
each row's codes and audio are those of the row alone, as the pipeline's batch-1 == batch-N contract needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .codec import check_codes, check_waves, frame_mask

SUPPORTED = ("DacModel", "EncodecModel", "MimiModel")


def model_kind(model) -> str:
    """'dac', 'encodec' or 'mimi' by the model's class (subclasses included)."""
    from transformers import DacModel, EncodecModel, MimiModel

    for cls, kind in ((DacModel, "dac"), (EncodecModel, "encodec"), (MimiModel, "mimi")):
        if isinstance(model, cls):
            return kind
    raise TypeError(f"HFCodec wraps transformers {', '.join(SUPPORTED)}; got {type(model).__name__}")


class HFCodec:
    """A `transformers` DAC / EnCodec / Mimi model behind the `AudioCodec` protocol; see the module docstring.

    The model is put in eval mode: DAC's quantizer drops codebooks at random in training mode.
    """

    def __init__(self, model, num_codebooks: int | None = None):
        self.kind = model_kind(model)
        self.model = model.eval()
        config = model.config
        self.sampling_rate = int(config.sampling_rate)
        self.codebook_size = int(config.codebook_size)
        min_codebooks = 1
        if self.kind == "dac":
            max_codebooks, self.hop_length, self.causal = int(config.n_codebooks), int(config.hop_length), False
        elif self.kind == "encodec":
            if config.chunk_length_s is not None or config.normalize:
                raise ValueError("HFCodec takes an EnCodec model that encodes whole clips without rescaling them "
                                 "(chunk_length_s=None, normalize=False, like encodec_24khz); chunked or "
                                 "normalised models need per-chunk scales that codes alone do not carry")
            if config.audio_channels != 1:
                raise ValueError(f"HFCodec takes mono audio; this EnCodec has {config.audio_channels} channels")
            counts = [self._encodec_quantizers(b) for b in config.target_bandwidths]
            max_codebooks = min(int(config.num_quantizers), max(counts))
            self.hop_length, self.causal = int(config.hop_length), self._causal(config)
        else:
            max_codebooks, min_codebooks = int(config.num_quantizers), max(1, int(config.num_semantic_quantizers))
            samples = self.sampling_rate / float(config.frame_rate)
            if abs(samples - round(samples)) > 1e-6:
                raise ValueError(f"Mimi frame_rate {config.frame_rate} is not a whole number of samples at "
                                 f"{self.sampling_rate} Hz")
            self.hop_length, self.causal = int(round(samples)), self._causal(config)
        if max_codebooks < 1:
            raise ValueError(f"this {type(model).__name__} has no quantizer (for EnCodec, raise target_bandwidths)")
        if num_codebooks is None:
            num_codebooks = max_codebooks
        if isinstance(num_codebooks, bool) or not isinstance(num_codebooks, int) or \
                not min_codebooks <= num_codebooks <= max_codebooks:
            raise ValueError(f"num_codebooks must be an int in {min_codebooks}..{max_codebooks} for this "
                             f"{type(model).__name__}, got {num_codebooks!r}")
        self.num_codebooks = num_codebooks
        if self.kind == "encodec":
            self.bandwidth = min(b for b in config.target_bandwidths if self._encodec_quantizers(b) >= num_codebooks)

    @property
    def frame_rate(self) -> float:
        """Code frames per second."""
        return self.sampling_rate / self.hop_length

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # --- the AudioCodec protocol ----------------------------------------------------------------
    @torch.no_grad()
    def encode(self, waves: torch.Tensor, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """waves [B, N] float mono at `sampling_rate` -> (codes [B, K, T] long, frame_lengths [B] long); codes of
        frames past a row's frame length are 0."""
        waves, lengths = self._check_waves(waves, lengths)
        hop = self.hop_length
        frame_lengths = (lengths + hop - 1) // hop
        frames = int(frame_lengths.max())
        waves = F.pad(waves, (0, max(0, frames * hop - waves.shape[1])))[:, : frames * hop]
        waves = waves * (torch.arange(frames * hop, device=waves.device)[None] < lengths[:, None])
        codes = torch.zeros(waves.shape[0], self.num_codebooks, frames, dtype=torch.long, device=waves.device)
        for rows, length in self._row_groups(frame_lengths, frames):
            group = self._encode(waves[rows, : length * hop])
            if group.shape[1:] != (self.num_codebooks, length):
                raise RuntimeError(f"{type(self.model).__name__} gave codes {tuple(group.shape)} for "
                                   f"{length * hop} samples; expected [{len(rows)}, {self.num_codebooks}, {length}] "
                                   f"at hop {hop}")
            codes[rows, :, :length] = group
        return codes * frame_mask(frame_lengths, frames)[:, None], frame_lengths

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, frame_lengths: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """codes [B, K, T] -> (waves [B, T * hop] float32, lengths [B] long = frame_lengths * hop); samples past
        a row's length are zeros."""
        codes = self._check_codes(codes)
        batch, _, frames = codes.shape
        if frame_lengths is None:
            frame_lengths = torch.full((batch,), frames, dtype=torch.long)
        frame_lengths = torch.as_tensor(frame_lengths).to(codes.device, torch.long)
        if frame_lengths.shape != (batch,) or bool((frame_lengths < 1).any()) or int(frame_lengths.max()) > frames:
            raise ValueError(f"frame_lengths must be [batch] ints in 1..{frames}, got {frame_lengths.tolist()}")
        hop = self.hop_length
        waves = torch.zeros(batch, frames * hop, device=codes.device)
        for rows, length in self._row_groups(frame_lengths, frames):
            audio = self._decode(codes[rows, :, :length])
            if audio.shape[-1] < length * hop:
                raise RuntimeError(f"{type(self.model).__name__} decoded {length} frames to {audio.shape[-1]} "
                                   f"samples; expected {length * hop}")
            waves[rows, : length * hop] = audio[:, : length * hop].float()
        lengths = frame_lengths * hop
        return waves * (torch.arange(frames * hop, device=waves.device)[None] < lengths[:, None]), lengths

    # --- per-model calls --------------------------------------------------------------------------
    def _encode(self, waves: torch.Tensor) -> torch.Tensor:
        """[b, n] (n a whole number of frames, no padding) -> codes [b, K, n / hop]."""
        x = waves[:, None].to(self.model.dtype)
        if self.kind == "dac":
            return self.model.encode(x, n_quantizers=self.num_codebooks, return_dict=True).audio_codes.long()
        if self.kind == "encodec":
            codes = self.model.encode(x, bandwidth=self.bandwidth, return_dict=True).audio_codes  # [1, b, K', t]
            return codes[0, :, : self.num_codebooks].long()
        return self.model.encode(x, num_quantizers=self.num_codebooks, return_dict=True).audio_codes.long()

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [b, K, t] -> audio [b, >= t * hop]."""
        if self.kind == "dac":
            return self.model.decode(audio_codes=codes, return_dict=True).audio_values
        if self.kind == "encodec":
            return self.model.decode(codes[None], [None], return_dict=True).audio_values[:, 0]
        return self.model.decode(codes, return_dict=True).audio_values[:, 0]

    def _row_groups(self, frame_lengths: torch.Tensor, frames: int):
        """(row indices, frames to run) per model call: one call for a causal codec, else one per row length."""
        if self.causal:
            return [(torch.arange(len(frame_lengths), device=frame_lengths.device), frames)]
        return [((frame_lengths == n).nonzero()[:, 0], int(n)) for n in frame_lengths.unique().tolist()]

    @staticmethod
    def _causal(config) -> bool:
        # trim_right_ratio < 1 keeps some of the transposed convolutions' right padding: a sample then hears a
        # little of the next frames, which in a padded batch are padding.
        return bool(config.use_causal_conv) and float(config.trim_right_ratio) == 1.0

    def _encodec_quantizers(self, bandwidth: float) -> int:
        return int(self.model.quantizer.get_num_quantizers_for_bandwidth(bandwidth))

    # --- checks -----------------------------------------------------------------------------------
    def _check_waves(self, waves, lengths):
        return check_waves(waves, lengths, self.device)

    def _check_codes(self, codes):
        return check_codes(codes, self.num_codebooks, self.codebook_size, self.device)
