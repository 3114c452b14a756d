"""The bundled audio codec: a residual-VQ spectral codec (16 kHz, 25 code frames/s, 8 × 1024 codes).

Every codec the TTS pipeline uses answers one small protocol (`AudioCodec`): sampling_rate, num_codebooks,
codebook_size, frame_rate, ``encode(waves, lengths) -> (codes [B, K, T], frame_lengths)`` and
``decode(codes, frame_lengths) -> (waves, lengths)``. `SpectralRVQCodec` is the bundled one;
`mmspec.speech.hf_codec.HFCodec` wraps a user's `transformers` DAC / EnCodec / Mimi.

Why a spectral codec and not a small `DacModel` trained here: a waveform codec spends nearly all its compute
in convolutions at the full sample rate (16 000 steps per second of audio) and needs adversarial training to
sound like speech, which two CPU cores cannot afford. This codec works at the rate of its codes: the encoder
reads log-mel frames stacked four to a code frame, a residual VQ (EMA codebooks, dead-code restarts,
quantizer dropout so codebook 0 carries the coarse content) quantizes, and the decoder predicts the STFT
log-magnitude at 100 frames/s; the waveform comes from Griffin-Lim phase reconstruction. Losses: L1 on
log-magnitude and log-mel, spectral convergence on linear magnitude, and the VQ commitment term. Speech it
decodes is intelligible to Whisper (see docs/tts.md), with Griffin-Lim's phasiness, which is the price.
For speculative decoding what matters is the RVQ structure of the codes, which is the same as DAC's or Mimi's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torchaudio
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn


class ConvNeXtBlock1d(nn.Module):
    """Depthwise conv (k=7) -> LayerNorm -> MLP, residual; [B, T, D] in and out.

    `valid` [B, T] zeroes padded frames before the convolution, so a row's output does not depend on how much
    padding its batch gave it (a padded frame then looks like the convolution's own zero padding)."""

    def __init__(self, dim: int, ffn: int):
        super().__init__()
        self.depthwise = nn.Conv1d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))
        self.scale = nn.Parameter(torch.full((dim,), 0.1))

    def forward(self, x, valid: torch.Tensor | None = None):
        if valid is not None:
            x = x * valid[..., None].to(x.dtype)
        y = self.depthwise(x.transpose(1, 2)).transpose(1, 2)
        return x + self.scale * self.mlp(self.norm(y))


class ResidualVQ(nn.Module):
    """Residual vector quantizer with EMA codebooks (no codebook gradients) and dead-code restarts.

    Codebooks are buffers updated by exponential moving averages of the vectors assigned to them, which
    converges faster than learning them by gradient; a code unused for a while is moved onto a random
    residual of the current batch, so all 1024 codes stay in use.
    """

    def __init__(self, num_codebooks: int, codebook_size: int, dim: int, decay: float = 0.99):
        super().__init__()
        self.num_codebooks, self.codebook_size, self.dim, self.decay = num_codebooks, codebook_size, dim, decay
        self.register_buffer("codebooks", torch.randn(num_codebooks, codebook_size, dim) * 0.1)
        self.register_buffer("ema_count", torch.ones(num_codebooks, codebook_size))
        self.register_buffer("ema_sum", self.codebooks.clone())
        self.register_buffer("initialised", torch.zeros((), dtype=torch.bool))

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K, T] -> summed code vectors [B, T, D] (any K <= num_codebooks: the first K levels)."""
        levels = torch.arange(codes.shape[1], device=codes.device)
        return self.codebooks[levels[None, :, None], codes].sum(1)

    def _nearest(self, residual: torch.Tensor, level: int) -> torch.Tensor:
        book = self.codebooks[level]
        distance = residual.pow(2).sum(-1, keepdim=True) - 2 * residual @ book.T + book.pow(2).sum(-1)
        return distance.argmin(-1)

    def forward(self, latents: torch.Tensor, valid: torch.Tensor | None = None, levels_per_row=None):
        """latents [B, T, D] -> (quantized [B, T, D] straight-through, codes [B, K, T], commitment loss).

        valid [B, T] marks real frames (padding is neither quantized into the EMA nor in the loss);
        levels_per_row [B] (training only): row b sums only its first levels_per_row[b] levels (quantizer
        dropout), though every level is still encoded and updated.
        """
        flat_valid = None if valid is None else valid.reshape(-1)
        if self.training and not bool(self.initialised):
            self._initialise(latents.detach().reshape(-1, self.dim)[flat_valid] if valid is not None
                             else latents.detach().reshape(-1, self.dim))
        residual = latents
        quantized = torch.zeros_like(latents)
        codes, commitment = [], latents.new_zeros(())
        for level in range(self.num_codebooks):
            code = self._nearest(residual.detach(), level)
            chosen = self.codebooks[level][code]
            if self.training:
                self._ema_update(level, residual.detach().reshape(-1, self.dim), code.reshape(-1), flat_valid)
                error = (residual - chosen.detach()).pow(2).mean(-1)
                commitment = commitment + (error[valid].mean() if valid is not None else error.mean())
            if levels_per_row is not None:
                keep = (level < levels_per_row).to(chosen.dtype)[:, None, None]
                quantized = quantized + chosen * keep
            else:
                quantized = quantized + chosen
            residual = residual - chosen
            codes.append(code)
        straight_through = latents + (quantized - latents).detach()
        return straight_through, torch.stack(codes, 1), commitment

    @torch.no_grad()
    def _initialise(self, vectors: torch.Tensor) -> None:
        """Seed every level from residuals of the first batch (a k-means++-free start: random picks)."""
        residual = vectors
        for level in range(self.num_codebooks):
            pick = torch.randint(0, residual.shape[0], (self.codebook_size,), device=vectors.device)
            self.codebooks[level] = residual[pick]
            self.ema_sum[level] = residual[pick]
            self.ema_count[level] = 1.0
            residual = residual - self.codebooks[level][self._nearest(residual, level)]
        self.initialised.fill_(True)

    @torch.no_grad()
    def _ema_update(self, level: int, vectors: torch.Tensor, codes: torch.Tensor, valid: torch.Tensor | None):
        if valid is not None:
            vectors, codes = vectors[valid], codes[valid]
        one_hot = F.one_hot(codes, self.codebook_size).to(vectors.dtype)
        self.ema_count[level].mul_(self.decay).add_(one_hot.sum(0), alpha=1 - self.decay)
        self.ema_sum[level].mul_(self.decay).add_(one_hot.T @ vectors, alpha=1 - self.decay)
        total = self.ema_count[level].sum()
        count = (self.ema_count[level] + 1e-5) / (total + self.codebook_size * 1e-5) * total
        self.codebooks[level] = self.ema_sum[level] / count[:, None]
        dead = self.ema_count[level] < 1e-3
        if bool(dead.any()) and vectors.shape[0]:
            pick = torch.randint(0, vectors.shape[0], (int(dead.sum()),), device=vectors.device)
            self.codebooks[level][dead] = vectors[pick]
            self.ema_sum[level][dead] = vectors[pick]
            self.ema_count[level][dead] = 1.0


class SpectralRVQCodec(ModelMixin, ConfigMixin):
    """Waveform <-> RVQ codes [B, K, T] at `frame_rate` (see the module docstring for the design)."""

    config_name = "config.json"

    @register_to_config
    def __init__(self, sampling_rate: int = 16_000, n_fft: int = 640, hop_length: int = 160,
                 stft_frames_per_code: int = 4, n_mels: int = 80, dim: int = 256, ffn: int = 768,
                 encoder_blocks: int = 4, decoder_blocks: int = 6, fine_dim: int = 128, fine_blocks: int = 2,
                 num_codebooks: int = 8, codebook_size: int = 1024, codebook_dim: int = 64,
                 griffin_lim_iterations: int = 32):
        super().__init__()
        self.n_bins = n_fft // 2 + 1
        self.samples_per_frame = hop_length * stft_frames_per_code
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)
        self.register_buffer("mel_filters", torchaudio.functional.melscale_fbanks(
            self.n_bins, 0.0, sampling_rate / 2, n_mels, sampling_rate, norm="slaney", mel_scale="slaney"),
            persistent=False)
        self.encoder_in = nn.Linear(n_mels * stft_frames_per_code, dim)
        self.encoder = nn.ModuleList([ConvNeXtBlock1d(dim, ffn) for _ in range(encoder_blocks)])
        self.encoder_out = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, codebook_dim))
        self.quantizer = ResidualVQ(num_codebooks, codebook_size, codebook_dim)
        self.decoder_in = nn.Linear(codebook_dim, dim)
        self.decoder = nn.ModuleList([ConvNeXtBlock1d(dim, ffn) for _ in range(decoder_blocks)])
        self.upsample = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, fine_dim * stft_frames_per_code))
        self.fine = nn.ModuleList([ConvNeXtBlock1d(fine_dim, 3 * fine_dim) for _ in range(fine_blocks)])
        self.to_spectrum = nn.Sequential(nn.LayerNorm(fine_dim), nn.Linear(fine_dim, self.n_bins))

    # --- the AudioCodec protocol ----------------------------------------------------------------
    @property
    def sampling_rate(self) -> int:
        return self.config.sampling_rate

    @property
    def num_codebooks(self) -> int:
        return self.config.num_codebooks

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    @property
    def frame_rate(self) -> float:
        return self.config.sampling_rate / self.samples_per_frame

    @torch.no_grad()
    def encode(self, waves: torch.Tensor, lengths: torch.Tensor | None = None):
        """waves [B, N] float mono at `sampling_rate` -> (codes [B, K, T] long, frame_lengths [B] long)."""
        waves, lengths = self._check_waves(waves, lengths)
        magnitude, frame_lengths = self.spectrum(waves, lengths)
        valid = frame_mask(frame_lengths, int(frame_lengths.max()))
        _, codes, _ = self.quantizer(self.encode_latents(magnitude, valid), valid)
        return codes, frame_lengths

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, frame_lengths: torch.Tensor | None = None):
        """codes [B, K, T] -> (waves [B, T * samples_per_frame] float32, lengths [B] long); samples past a
        row's length are zeros. Each row's waveform is that of the row decoded alone: the network masks
        padding, and Griffin-Lim runs per row over the row's own frames."""
        codes = self._check_codes(codes)
        batch, _, frames = codes.shape
        if frame_lengths is None:
            frame_lengths = torch.full((batch,), frames, dtype=torch.long)
        frame_lengths = frame_lengths.to(codes.device, torch.long)
        if frame_lengths.shape != (batch,) or bool((frame_lengths < 1).any()) or int(frame_lengths.max()) > frames:
            raise ValueError(f"frame_lengths must be [batch] ints in 1..{frames}, got {frame_lengths.tolist()}")
        valid = frame_mask(frame_lengths, frames)
        magnitude = self.decode_latents(self.quantizer.lookup(codes), valid).float().exp()
        waves = torch.zeros(batch, frames * self.samples_per_frame, device=codes.device)
        for row, length in enumerate(frame_lengths.tolist()):
            fine = magnitude[row, : length * self.config.stft_frames_per_code]
            fine = torch.cat([fine, fine[-1:]], 0)  # the centred STFT's final frame
            griffin_lim = torchaudio.transforms.GriffinLim(
                n_fft=self.config.n_fft, hop_length=self.config.hop_length, win_length=self.config.n_fft,
                power=1.0, n_iter=self.config.griffin_lim_iterations, momentum=0.99,
                length=length * self.samples_per_frame, rand_init=False).to(codes.device)
            waves[row, : length * self.samples_per_frame] = griffin_lim(fine.T)
        return waves, frame_lengths * self.samples_per_frame

    # --- pieces, also used by training -------------------------------------------------------
    def spectrum(self, waves: torch.Tensor, lengths: torch.Tensor):
        """Pad to whole code frames -> (STFT magnitude [B, 4T, bins], frame_lengths [B] = ceil(len / 640))."""
        step = self.samples_per_frame
        frame_lengths = (lengths + step - 1) // step
        total = int(frame_lengths.max()) * step
        waves = F.pad(waves, (0, total - waves.shape[1]))
        keep = torch.arange(total, device=waves.device)[None] < lengths[:, None]
        spec = torch.stft(waves.float() * keep, self.config.n_fft, self.config.hop_length, self.config.n_fft,
                          self.window, return_complex=True)
        return spec.abs().transpose(1, 2)[:, : total // self.config.hop_length], frame_lengths

    def log_mel(self, magnitude: torch.Tensor) -> torch.Tensor:
        return torch.log(magnitude @ self.mel_filters + 1e-5)

    def encode_latents(self, magnitude: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """[B, 4T, bins] magnitude -> [B, T, codebook_dim] latents before quantization (valid [B, T]: real
        frames, None: all)."""
        mel = self.log_mel(magnitude)
        batch, fine_frames, _ = mel.shape
        x = self.encoder_in(mel.reshape(batch, fine_frames // self.config.stft_frames_per_code, -1))
        for block in self.encoder:
            x = block(x, valid)
        return self.encoder_out(x)

    def decode_latents(self, quantized: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T, codebook_dim] -> predicted log-magnitude [B, 4T, bins]."""
        x = self.decoder_in(quantized)
        for block in self.decoder:
            x = block(x, valid)
        batch, frames, _ = x.shape
        per_code = self.config.stft_frames_per_code
        x = self.upsample(x).reshape(batch, frames * per_code, self.config.fine_dim)
        fine_valid = None if valid is None else valid.repeat_interleave(per_code, 1)
        for block in self.fine:
            x = block(x, fine_valid)
        return self.to_spectrum(x)

    def reconstruction_losses(self, waves: torch.Tensor, lengths: torch.Tensor, levels_per_row=None) -> dict:
        """Training losses of one batch (see the module docstring)."""
        magnitude, frame_lengths = self.spectrum(waves, lengths)
        valid = frame_mask(frame_lengths, int(frame_lengths.max()))
        quantized, _, commitment = self.quantizer(self.encode_latents(magnitude, valid), valid, levels_per_row)
        predicted = self.decode_latents(quantized, valid).float()
        fine_valid = valid.repeat_interleave(self.config.stft_frames_per_code, 1)[..., None].float()
        target_log = torch.log(magnitude + 1e-5)
        count = fine_valid.sum() * self.n_bins
        log_l1 = ((predicted - target_log).abs() * fine_valid).sum() / count
        predicted_magnitude = predicted.exp() * fine_valid
        convergence = torch.linalg.norm(predicted_magnitude - magnitude * fine_valid) / \
            torch.linalg.norm(magnitude * fine_valid).clamp(min=1e-5)
        mel_l1 = ((self.log_mel(predicted_magnitude) - self.log_mel(magnitude * fine_valid)).abs()
                  * fine_valid).sum() / (fine_valid.sum() * self.config.n_mels)
        total = log_l1 + convergence + mel_l1 + 0.25 * commitment
        return {"loss": total, "log_magnitude_l1": log_l1, "spectral_convergence": convergence, "mel_l1": mel_l1,
                "commitment": commitment}

    # --- checks -------------------------------------------------------------------------------
    def _check_waves(self, waves, lengths):
        return check_waves(waves, lengths, self.device)

    def _check_codes(self, codes):
        return check_codes(codes, self.num_codebooks, self.codebook_size, self.device)


def frame_mask(lengths: torch.Tensor, size: int) -> torch.Tensor:
    """[B, size] True before each row's length."""
    return torch.arange(size, device=lengths.device)[None] < lengths[:, None]


def check_waves(waves, lengths, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The `AudioCodec.encode` input checks: waves [B, N] float, lengths [B] in 1..N (None: all N)."""
    if not isinstance(waves, torch.Tensor) or waves.ndim != 2 or not waves.is_floating_point():
        raise ValueError(f"waves must be a float tensor [batch, samples], got "
                         f"{getattr(waves, 'shape', type(waves).__name__)}")
    if waves.shape[0] == 0 or waves.shape[1] == 0:
        raise ValueError(f"waves must hold at least one sample per row, got shape {tuple(waves.shape)}")
    if lengths is None:
        lengths = torch.full((waves.shape[0],), waves.shape[1], dtype=torch.long)
    lengths = torch.as_tensor(lengths).to(device, torch.long)
    if lengths.shape != (waves.shape[0],) or bool((lengths < 1).any()) or bool((lengths > waves.shape[1]).any()):
        raise ValueError(f"lengths must be [batch] ints in 1..{waves.shape[1]}, got {lengths.tolist()}")
    return waves.to(device, torch.float32), lengths


def check_codes(codes, num_codebooks: int, codebook_size: int, device) -> torch.Tensor:
    """The `AudioCodec.decode` input checks: integer codes [B, K, T] with K = num_codebooks, in range."""
    if not isinstance(codes, torch.Tensor) or codes.ndim != 3 or codes.is_floating_point():
        raise ValueError(f"codes must be an integer tensor [batch, codebooks, frames], got "
                         f"{getattr(codes, 'shape', type(codes).__name__)}")
    if codes.shape[1] != num_codebooks:
        raise ValueError(f"codes have {codes.shape[1]} codebooks; this codec has {num_codebooks}")
    if codes.shape[0] == 0 or codes.shape[2] == 0:
        raise ValueError(f"codes must hold at least one frame per row, got shape {tuple(codes.shape)}")
    if int(codes.min()) < 0 or int(codes.max()) >= codebook_size:
        raise ValueError(f"codes must lie in 0..{codebook_size - 1}, got {int(codes.min())}..{int(codes.max())}")
    return codes.to(device, torch.long)


def codec_summary(codec) -> str:
    """'8 × 1024 codes at 25 frames/s, 16 kHz' for messages and docs."""
    bits = codec.num_codebooks * math.log2(codec.codebook_size) * codec.frame_rate
    return (f"{codec.num_codebooks} × {codec.codebook_size} codes at {codec.frame_rate:g} frames/s, "
            f"{codec.sampling_rate // 1000} kHz ({bits / 1000:.1f} kbit/s)")
