"""Image metrics: Fréchet distance against scipy's reference formula, accuracy, NLL, grids."""

import numpy as np
import pytest
import torch
from scipy import linalg

from mmspec.vision.llamagen import LlamaGenModel
from mmspec.vision.metrics import build_classifier, class_accuracy, features, frechet_distance, save_image_grid, \
    target_nll


def scipy_fd(a, b):
    mu_a, mu_b = a.mean(0), b.mean(0)
    s_a, s_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean = linalg.sqrtm(s_a @ s_b).real
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(s_a + s_b - 2 * covmean))


def test_frechet_distance_matches_the_reference_formula():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(400, 6, generator=gen, dtype=torch.float64)
    b = torch.randn(300, 6, generator=gen, dtype=torch.float64) @ torch.randn(6, 6, generator=gen,
                                                                             dtype=torch.float64) + 0.5
    assert frechet_distance(a, b) == pytest.approx(scipy_fd(a.numpy(), b.numpy()), rel=1e-6)
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-8)
    with pytest.raises(ValueError, match="at least 2"):
        frechet_distance(a[:1], b)


def test_classifier_features_and_accuracy_shapes():
    torch.manual_seed(0)
    model = build_classifier().eval()
    images = torch.rand(5, 3, 64, 64)
    assert features(model, images).shape == (5, model.num_features)
    acc = class_accuracy(model, images, torch.zeros(5, dtype=torch.long))
    assert 0.0 <= acc <= 1.0


def test_target_nll_equals_cross_entropy():
    torch.manual_seed(0)
    model = LlamaGenModel(dim=32, n_layer=1, n_head=4, multiple_of=8, num_classes=2, vocab_size=8,
                          block_size=4).eval()
    labels, tokens = torch.tensor([0, 1]), torch.randint(0, 8, (2, 4))
    seq = torch.cat([model.class_token(labels)[:, None], tokens[:, :-1]], 1)
    expected = torch.nn.functional.cross_entropy(model(seq).reshape(-1, 8), tokens.reshape(-1)).item()
    assert target_nll(model, labels, tokens) == pytest.approx(expected, rel=1e-5)


def test_image_grid(tmp_path):
    path = tmp_path / "g.png"
    save_image_grid(torch.rand(5, 3, 8, 8), rows=2, path=path)
    from PIL import Image

    assert Image.open(path).size == (24, 16)
