"""Smoke tests of the vision training scripts: a few steps on a handful of real crops, then resume."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from run_example import run_example

pytestmark = pytest.mark.train

run = run_example


def weights(path: Path) -> dict:
    return load_file(next(path.glob("*.safetensors")))


@pytest.fixture(scope="module")
def crops_dir(tmp_path_factory):
    """Crops cached once (as train_vq.py would) so the three scripts share them."""
    from mmspec.vision.data import make_crops

    d = tmp_path_factory.mktemp("crops")
    torch.save(make_crops("train", 4, 0), d / "crops_train_4_0.pt")
    torch.save(make_crops("heldout", 2, 0), d / "crops_heldout_2_0.pt")
    return d


@pytest.mark.filterwarnings("ignore")
def test_train_vq_runs_and_resumes_exactly(tmp_path, crops_dir):
    common = ["--per-class", 4, "--heldout-per-class", 2, "--batch-size", 4, "--restart-every", 1,
              "--ckpt-every", 1]
    for name in ("crops_train_4_0.pt", "crops_heldout_2_0.pt"):
        for work in ("a", "b"):
            (tmp_path / work).mkdir(exist_ok=True)
            (tmp_path / work / name).write_bytes((crops_dir / name).read_bytes())
    run("train_vq.py", common + ["--steps", 3, "--work-dir", tmp_path / "a", "--out", tmp_path / "out_a"])
    run("train_vq.py", common + ["--steps", 1, "--work-dir", tmp_path / "b", "--out", tmp_path / "out_b1"])
    run("train_vq.py", common + ["--steps", 3, "--work-dir", tmp_path / "b", "--out", tmp_path / "out_b"])
    a, b = weights(tmp_path / "out_a"), weights(tmp_path / "out_b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.filterwarnings("ignore")
def test_train_llamagen_smoke(tmp_path, crops_dir):
    run("train_llamagen.py", ["--steps", 2, "--per-class", 4, "--heldout-per-class", 2, "--batch-size", 2,
                              "--eval-every", 1, "--crops-dir", crops_dir, "--work-dir", tmp_path / "w",
                              "--out", tmp_path / "out"])
    from mmspec.vision.llamagen import LlamaGenModel

    model = LlamaGenModel.from_pretrained(tmp_path / "out")
    assert model.config.vocab_size == 512 and model.config.num_classes == 10


@pytest.mark.filterwarnings("ignore")
def test_train_classifier_smoke(tmp_path, crops_dir):
    run("train_classifier.py", ["--steps", 2, "--per-class", 4, "--heldout-per-class", 2, "--batch-size", 4,
                                "--ckpt-every", 1, "--crops-dir", crops_dir, "--work-dir", tmp_path / "w",
                                "--out", tmp_path / "out"])
    from mmspec.vision.metrics import build_classifier

    state = load_file(tmp_path / "out" / "model.safetensors")
    model = build_classifier()
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing)


def test_train_ssd_heads_runs_and_resumes_exactly(tmp_path):
    from mmspec.plugins.ssd import SpatialHeads

    common = ["--per-class", 2, "--heldout-per-class", 1, "--batch-size", 4, "--eval-every", 2,
              "--work-dir", tmp_path / "work"]
    run("train_ssd_heads.py", common + ["--steps", 2, "--out", tmp_path / "a"])
    run("train_ssd_heads.py", common + ["--steps", 4, "--out", tmp_path / "resumed"])  # picks up at step 2
    run("train_ssd_heads.py", ["--per-class", 2, "--heldout-per-class", 1, "--batch-size", 4, "--eval-every", 2,
                               "--work-dir", tmp_path / "fresh", "--steps", 4, "--out", tmp_path / "straight"])
    resumed, straight = weights(tmp_path / "resumed"), weights(tmp_path / "straight")
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[k], straight[k]) for k in resumed)
    assert not torch.equal(weights(tmp_path / "a")["right.block.weight"], resumed["right.block.weight"])
    heads = SpatialHeads.from_pretrained(tmp_path / "resumed")
    assert heads.config.grid_width == 16 and heads.prior_logits.shape == (512,)


def test_train_eagle_head_runs_and_resumes_exactly(tmp_path):
    from mmspec.plugins.lantern import EagleHead

    common = ["--per-class", 2, "--heldout-per-class", 1, "--batch-size", 4, "--eval-every", 2]
    run("train_eagle_head.py", common + ["--work-dir", tmp_path / "work", "--steps", 2, "--out", tmp_path / "a"])
    run("train_eagle_head.py", common + ["--work-dir", tmp_path / "work", "--steps", 4, "--out", tmp_path / "resumed"])
    run("train_eagle_head.py", common + ["--work-dir", tmp_path / "fresh", "--steps", 4,
                                         "--out", tmp_path / "straight"])
    resumed, straight = weights(tmp_path / "resumed"), weights(tmp_path / "straight")
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[k], straight[k]) for k in resumed)
    assert not torch.equal(weights(tmp_path / "a")["fc.weight"], resumed["fc.weight"])
    assert EagleHead.from_pretrained(tmp_path / "resumed").config.hidden_size == 256
