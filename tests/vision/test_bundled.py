"""The bundled llamagen-tiny pipeline: it loads, draws the right classes, and benches with quality."""

import json

import pytest
import torch

from mmspec import load_plugin
from mmspec.common import cli
from mmspec.common.bench import run_bench
from mmspec.vision.pipeline import ARImagePipeline


# The Triton path is covered by test_kernels; under the interpreter these decode loops would take minutes.
pytestmark = [pytest.mark.usefixtures("torch_kernels_module"), pytest.mark.e2e]


@pytest.fixture(scope="module")
def pipe():
    from mmspec.vision.pipeline import bundled_pipeline

    p = load_plugin("ar", pipeline=bundled_pipeline())
    p.set_progress_bar_config(disable=True)
    return p


def test_bundled_samples_are_recognisably_their_class(pipe):
    """One image per class at CFG 3: the bundled classifier must recognise most of them."""
    from mmspec.vision.metrics import class_accuracy, load_bundled_classifier

    labels = list(range(pipe.num_classes)) * 2
    out = pipe(class_labels=labels, guidance_scale=3.0, output_type="pt",
               generator=[torch.Generator().manual_seed(i) for i in range(len(labels))])
    assert out.images.shape == (20, 3, 64, 64)
    assert class_accuracy(load_bundled_classifier(), out.images, torch.tensor(labels)) >= 0.6


def test_bundled_round_trip(pipe, tmp_path):
    pipe.save_pretrained(tmp_path / "p")
    again = ARImagePipeline.from_pretrained(tmp_path / "p")
    again.set_progress_bar_config(disable=True)
    a = pipe(class_labels=[4], generator=torch.Generator().manual_seed(0), output_type="pt")
    b = again(class_labels=[4], generator=torch.Generator().manual_seed(0), output_type="pt")
    assert torch.equal(a.tokens, b.tokens)


def test_bench_ar_reports_the_quality_block():
    result = run_bench("ar", model="llamagen-tiny", num_samples=4, batch_size=2, progress=lambda _: None)
    for side in ("baseline", "accelerated"):
        assert set(result[side]["quality"]) == {"class_acc", "fd", "fd_floor", "nll"}
    assert result["exact_match_rate"] is None  # sampling by default
    assert result["step_compression"] == 1.0
    json.dumps(result)


def test_cli_generate_writes_a_grid(tmp_path):
    out = tmp_path / "grid.png"
    assert cli.main(["generate", "ar", "--model", "llamagen-tiny", "--num", "4", "--out", str(out)]) == 0
    from PIL import Image

    assert Image.open(out).size == (4 * 64, 64)  # a column per class, one row per cycle
