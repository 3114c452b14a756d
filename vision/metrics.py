"""Image quality metrics for benches: a bundled timm classifier trained on real crops gives
class accuracy of generated images and a Fréchet distance in its penultimate features."""

from __future__ import annotations

from pathlib import Path

import torch

from .tokenizer import BUNDLED_DIR

CLASSIFIER_ARCH = "resnet10t"


def build_classifier(num_classes: int = 10):
    import timm

    return timm.create_model(CLASSIFIER_ARCH, pretrained=False, num_classes=num_classes)


def load_bundled_classifier(device: str | torch.device = "cpu"):
    from safetensors.torch import load_file

    path = BUNDLED_DIR / "classifier" / "model.safetensors"
    if not path.exists():
        raise FileNotFoundError(f"bundled classifier not found at {path}; run examples/train_classifier.py")
    model = build_classifier()
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in load_file(path).items()}, strict=False)
    # Only BatchNorm's step counters are left out of the file; anything else is a real mismatch.
    if unexpected or any(not k.endswith("num_batches_tracked") for k in missing):
        raise ValueError(f"classifier weights do not match {CLASSIFIER_ARCH}: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.to(device).eval()


def _batches(images: torch.Tensor, size: int = 200):
    for i in range(0, len(images), size):
        yield images[i:i + size]


@torch.no_grad()
def classify(classifier, images: torch.Tensor) -> torch.Tensor:
    """images [N, 3, H, W] in [0, 1] -> predicted labels [N]."""
    device = next(classifier.parameters()).device
    return torch.cat([classifier(normalize(b.to(device))).argmax(-1).cpu() for b in _batches(images)])


@torch.no_grad()
def features(classifier, images: torch.Tensor) -> torch.Tensor:
    """[N, 3, H, W] in [0, 1] -> [N, F] pooled penultimate features (float64)."""
    device = next(classifier.parameters()).device
    out = [classifier.forward_head(classifier.forward_features(normalize(b.to(device))), pre_logits=True)
           for b in _batches(images)]
    return torch.cat(out).double().cpu()


def normalize(images: torch.Tensor) -> torch.Tensor:
    """[0, 1] -> the classifier's input range [-1, 1]."""
    return images * 2 - 1


def class_accuracy(classifier, images: torch.Tensor, labels: torch.Tensor) -> float:
    return float(class_hits(classifier, images, labels).float().mean())


def class_hits(classifier, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[N] bool: the bundled classifier names each image's class."""
    return classify(classifier, images) == labels.cpu()


def frechet_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fréchet distance between Gaussians fitted to feature sets a [N, F] and b [M, F].

    ||mu_a - mu_b||^2 + tr(S_a + S_b - 2 (S_a^1/2 S_b S_a^1/2)^1/2), with the matrix square root
    taken through symmetric eigendecompositions (stable for PSD covariances).
    """
    if len(a) < 2 or len(b) < 2:
        raise ValueError("frechet_distance needs at least 2 samples on each side")
    a, b = a.double(), b.double()
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = torch.cov(a.T), torch.cov(b.T)
    evals, evecs = torch.linalg.eigh(cov_a)
    sqrt_a = evecs @ torch.diag(evals.clamp(min=0).sqrt()) @ evecs.T
    middle = torch.linalg.eigvalsh(sqrt_a @ cov_b @ sqrt_a).clamp(min=0).sqrt().sum()
    return float((mu_a - mu_b).pow(2).sum() + cov_a.trace() + cov_b.trace() - 2 * middle)


@torch.no_grad()
def target_nll(transformer, labels: torch.Tensor, tokens: torch.Tensor) -> float:
    """Mean NLL (nats/token) of generated codes under the conditional model (no guidance)."""
    return float(target_nll_per_image(transformer, labels, tokens).sum()) / max(1, tokens.numel())


@torch.no_grad()
def target_nll_per_image(transformer, labels: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Summed NLL (nats) of each image's codes under the conditional model (no guidance): [N] on the CPU."""
    device = next(transformer.parameters()).device
    sums = []
    for i in range(0, len(tokens), 64):
        lab, tok = labels[i:i + 64].to(device), tokens[i:i + 64].to(device)
        seq = torch.cat([transformer.class_token(lab)[:, None], tok[:, :-1]], 1)
        logp = transformer(seq).float().log_softmax(-1)
        sums.append(-logp.gather(2, tok[:, :, None])[..., 0].sum(1).double().cpu())
    return torch.cat(sums) if sums else torch.zeros(0, dtype=torch.float64)


def save_image_grid(images: torch.Tensor, rows: int, path: str | Path) -> None:
    """images [N, 3, H, W] in [0, 1] -> one PNG, row-major."""
    import PIL.Image

    n, _, h, w = images.shape
    cols = -(-n // rows)
    canvas = torch.ones(3, rows * h, cols * w)
    for i in range(n):
        r, c = divmod(i, cols)
        canvas[:, r * h:(r + 1) * h, c * w:(c + 1) * w] = images[i]
    array = (canvas.permute(1, 2, 0).clamp(0, 1) * 255).round().byte().numpy()
    PIL.Image.fromarray(array).save(path)
