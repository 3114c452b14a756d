"""VQ image tokenizer helpers over a diffusers `VQModel`: images <-> grids of codes."""

from __future__ import annotations

from pathlib import Path

import torch
from diffusers import VQModel

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


def load_bundled_vq(device: str | torch.device = "cpu") -> VQModel:
    path = BUNDLED_DIR / "vq"
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"bundled VQ tokenizer not found under {path}; run examples/train_vq.py")
    return VQModel.from_pretrained(path, torch_dtype=torch.float32).to(device).eval()


@torch.no_grad()
def encode_codes(vq: VQModel, images: torch.Tensor) -> torch.Tensor:
    """images [B, 3, H, W] in [-1, 1] -> codes [B, H/4, W/4] long."""
    h = vq.encode(images).latents
    _, _, (_, _, indices) = vq.quantize(h.float())
    return indices.view(images.shape[0], h.shape[2], h.shape[3])


@torch.no_grad()
def decode_codes(vq: VQModel, codes: torch.Tensor) -> torch.Tensor:
    """codes [B, h, w] long -> images [B, 3, 4h, 4w] in [-1, 1]."""
    batch, h, w = codes.shape
    dim = vq.config.vq_embed_dim or vq.config.latent_channels
    quant = vq.quantize.get_codebook_entry(codes.reshape(batch, -1), shape=(batch, h, w, dim))
    return vq.decoder(vq.post_quant_conv(quant)).clamp(-1, 1)


def codebook(vq: VQModel) -> torch.Tensor:
    """[num_codes, dim] code vectors (latent proximity for relaxed acceptance)."""
    return vq.quantize.embedding.weight.detach()
