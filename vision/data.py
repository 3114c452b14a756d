"""Natural-photo crops from the photos that ship inside scikit-image and scikit-learn.

Class = source photo. Each photo is scaled so its short side is 192 px; the
rightmost HELDOUT_COLUMNS columns are held out, so held-out crops show image
regions never seen in training. Everything is deterministic for a given seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

CLASS_NAMES = ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry",
               "retina", "colorwheel", "china", "flower")
SHORT_SIDE = 192
HELDOUT_COLUMNS = 80  # a 64-80 px held-out crop must fit inside this strip
IMAGE_SIZE = 64


def load_photo(name: str) -> np.ndarray:
    """[H, W, 3] uint8 photo by class name."""
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image

        return load_sample_image(f"{name}.jpg")
    from skimage import data

    if name not in CLASS_NAMES:
        raise ValueError(f"unknown photo {name!r}; available: {CLASS_NAMES}")
    return getattr(data, name)()


def scaled_photo(name: str) -> torch.Tensor:
    """[3, H, W] float in [0, 1], short side SHORT_SIDE."""
    img = torch.from_numpy(np.array(load_photo(name), copy=True)).permute(2, 0, 1).float() / 255.0
    h, w = img.shape[1:]
    scale = SHORT_SIDE / min(h, w)
    size = (round(h * scale), round(w * scale))
    return F.interpolate(img[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0].clamp(0, 1)


@dataclass
class CropSet:
    images: torch.Tensor  # [N, 3, 64, 64] uint8
    labels: torch.Tensor  # [N] long

    def float_images(self) -> torch.Tensor:
        """[N, 3, 64, 64] in [-1, 1], the models' input range."""
        return self.images.float() / 127.5 - 1.0


def make_crops(split: str, per_class: int, seed: int = 0) -> CropSet:
    """Random square crops, resized to 64x64. Train: side 64-96 from the left part, random flips;
    held-out: side 64-80 from the right strip, no flips."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if per_class < 1:
        raise ValueError(f"per_class must be >= 1, got {per_class}")
    gen = torch.Generator().manual_seed(seed + (0 if split == "train" else 10_000))
    images, labels = [], []
    for label, name in enumerate(CLASS_NAMES):
        photo = scaled_photo(name)
        _, h, w = photo.shape
        x_lo, x_hi = (0, w - HELDOUT_COLUMNS) if split == "train" else (w - HELDOUT_COLUMNS, w)
        side_lo, side_hi = (64, 96) if split == "train" else (64, 80)
        for _ in range(per_class):
            side = int(torch.randint(side_lo, side_hi + 1, (1,), generator=gen))
            x = int(torch.randint(x_lo, x_hi - side + 1, (1,), generator=gen))
            y = int(torch.randint(0, h - side + 1, (1,), generator=gen))
            crop = photo[:, y:y + side, x:x + side]
            if side != IMAGE_SIZE:
                crop = F.interpolate(crop[None], size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear",
                                     antialias=True, align_corners=False)[0]
            if split == "train" and bool(torch.rand(1, generator=gen) < 0.5):
                crop = crop.flip(-1)
            images.append((crop.clamp(0, 1) * 255).round().to(torch.uint8))
            labels.append(label)
    return CropSet(torch.stack(images), torch.tensor(labels))


def code_dataset(work_dir, split: str, per_class: int, seed: int, vq) -> dict:
    """{"codes": [N, h*w] long, "labels": [N]}: the VQ codes of `make_crops(split, per_class, seed)`, cached in
    work_dir (training the heads of decoding plugins on the bundled model)."""
    from pathlib import Path

    from .tokenizer import encode_codes

    path = Path(work_dir) / f"codes_{split}_{per_class}_{seed}.pt"
    if path.exists():
        return torch.load(path, weights_only=False)  # our own cache file
    crops = make_crops(split, per_class, seed)
    images = crops.float_images()
    with torch.no_grad():
        codes = torch.cat([encode_codes(vq, images[i:i + 250]) for i in range(0, len(images), 250)])
    out = {"codes": codes.flatten(1), "labels": crops.labels}
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    torch.save(out, path)
    return out
