"""ARImagePipeline with tiny random components: outputs, determinism, save/load, bad inputs."""

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import VQModel

from mmspec import load_plugin
from mmspec.vision.llamagen import LlamaGenModel
from mmspec.vision.pipeline import ARImagePipeline

TINY_GPT = dict(dim=32, n_layer=2, n_head=4, multiple_of=8, num_classes=3, vocab_size=16, block_size=16)
TINY_VQ = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
               up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(8, 8, 8), layers_per_block=1,
               latent_channels=4, num_vq_embeddings=16, vq_embed_dim=4, norm_num_groups=4, sample_size=16)


@pytest.fixture(scope="module")
def pipe():
    torch.manual_seed(0)
    pipeline = ARImagePipeline(LlamaGenModel(**TINY_GPT).eval(), VQModel(**TINY_VQ).eval())
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def test_generates_images_of_every_output_type(pipe):
    out = pipe(class_labels=[0, 2], num_images_per_prompt=2, generator=gens(range(4)))
    assert len(out.images) == 4 and isinstance(out.images[0], PIL.Image.Image)
    assert out.images[0].size == (16, 16)
    assert out.tokens.shape == (4, 16) and out.stats.tokens == 64
    arr = pipe(class_labels=1, output_type="np", generator=gens([0])).images
    assert arr.shape == (1, 16, 16, 3) and arr.min() >= 0 and arr.max() <= 1
    pt = pipe(class_labels=1, output_type="pt", generator=gens([0])).images
    assert pt.shape == (1, 3, 16, 16)
    assert np.allclose(pt.permute(0, 2, 3, 1).numpy(), arr)


def test_batch_of_four_equals_four_batches_of_one(pipe):
    batched = pipe(class_labels=[0, 1, 2, 1], generator=gens([5, 6, 7, 8]), output_type="pt")
    for i, (label, seed) in enumerate(zip([0, 1, 2, 1], [5, 6, 7, 8])):
        single = pipe(class_labels=label, generator=gens([seed]), output_type="pt")
        assert torch.equal(single.tokens[0], batched.tokens[i])


def test_same_seed_same_images(pipe):
    a = pipe(class_labels=[2], generator=torch.Generator().manual_seed(3), output_type="pt")
    b = pipe(class_labels=[2], generator=torch.Generator().manual_seed(3), output_type="pt")
    assert torch.equal(a.images, b.images)


def test_save_load_round_trip(pipe, tmp_path):
    pipe.save_pretrained(tmp_path / "p")
    loaded = ARImagePipeline.from_pretrained(tmp_path / "p")
    loaded.set_progress_bar_config(disable=True)
    a = pipe(class_labels=[0, 1], generator=gens([1, 2]), output_type="pt")
    b = loaded(class_labels=[0, 1], generator=gens([1, 2]), output_type="pt")
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.images, b.images)


def test_diffusers_loader_loads_a_saved_folder_with_its_plugin(pipe, tmp_path):
    """diffusers' own DiffusionPipeline.from_pretrained loads our folder (its custom-pipeline route: opt-in with
    trust_remote_code, as for any folder that carries code), plugin included; our loader needs no opt-in while
    the folder's code is exactly the import line we wrote, and asks for it once that file is changed."""
    from diffusers import DiffusionPipeline

    load_plugin("sjd", pipeline=pipe).save_pretrained(tmp_path / "p")
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        DiffusionPipeline.from_pretrained(tmp_path / "p")
    loaded = DiffusionPipeline.from_pretrained(tmp_path / "p", trust_remote_code=True)
    assert type(loaded) is ARImagePipeline and loaded.plugin.name == "sjd"
    loaded.set_progress_bar_config(disable=True)
    a = pipe(class_labels=[0, 1], temperature=0, output_type="pt")
    b = loaded(class_labels=[0, 1], temperature=0, output_type="pt")
    assert torch.equal(a.tokens, b.tokens) and b.stats.target_nfe < a.stats.target_nfe  # the plugin ran, losslessly
    assert ARImagePipeline.from_pretrained(tmp_path / "p").plugin.name == "sjd"
    shim = tmp_path / "p" / "pipeline.py"
    shim.write_text(shim.read_text() + "print('not ours')\n")
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        ARImagePipeline.from_pretrained(tmp_path / "p")


def test_greedy_without_guidance_follows_the_model(pipe):
    out = pipe(class_labels=[1], guidance_scale=1.0, temperature=0, output_type="pt")
    seq = pipe.transformer.class_token(torch.tensor([1]))[:, None]
    with torch.no_grad():
        for _ in range(16):
            seq = torch.cat([seq, pipe.transformer(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out.tokens, seq[:, 1:])


def test_callback_and_plugin_switch(pipe):
    seen = []
    pipe(class_labels=0, generator=gens([0]), callback_on_step_end=lambda p, i, t, kw: seen.append(i))
    assert seen == list(range(16))
    ar = load_plugin("ar", pipeline=pipe)
    assert ar is not pipe and ar.transformer is pipe.transformer and ar.plugin.name == "ar"
    with pytest.raises(ValueError, match="decodes TokenSequence tokens; ARImagePipeline offers CodeGrid"):
        load_plugin("speculative", pipeline=pipe)


def test_diffusers_habits_integer_like_labels_and_callback_tensor_inputs(pipe):
    expected = pipe(class_labels=[1, 2], generator=gens([0, 1]), output_type="pt").tokens
    for labels in (torch.tensor([1, 2]), np.array([1, 2]), [np.int64(1), torch.tensor(2).item()]):
        assert torch.equal(pipe(class_labels=labels, generator=gens([0, 1]), output_type="pt").tokens, expected)
    assert torch.equal(pipe(class_labels=np.int64(1), generator=gens([0]), output_type="pt").tokens, expected[:1])
    seen = []
    pipe(class_labels=torch.tensor(0), generator=gens([0]), callback_on_step_end_tensor_inputs=["tokens"],
         callback_on_step_end=lambda p, i, t, kw: seen.append(sorted(kw)))
    assert seen and all(keys == ["tokens"] for keys in seen)
    with pytest.raises(ValueError, match=r"callback_on_step_end_tensor_inputs \['latents'\] are not available"):
        pipe(class_labels=0, callback_on_step_end_tensor_inputs=["latents"])
    for bad in (torch.tensor([1.0]), np.array([True]), torch.tensor([[1]])):
        with pytest.raises(ValueError, match="class_labels must be an int or a non-empty list of ints"):
            pipe(class_labels=bad)


@pytest.mark.parametrize("kwargs, match", [
    (dict(class_labels=3), r"out of range: allowed 0\.\.2"),
    (dict(class_labels=[-1]), "out of range"),
    (dict(class_labels=None), "class_labels is required"),
    (dict(class_labels=[]), "non-empty"),
    (dict(class_labels=[0], guidance_scale=0.5), "guidance_scale must be >= 1"),
    (dict(class_labels=[0], num_images_per_prompt=0), "num_images_per_prompt"),
    (dict(class_labels=[0], output_type="jpeg"), "output_type must be one of"),
    (dict(class_labels=[0], temperature=-1), "temperature"),
    (dict(class_labels=[0, 1], generator=[torch.Generator()]), "generator"),
])
def test_bad_inputs(pipe, kwargs, match):
    with pytest.raises(ValueError, match=match):
        pipe(**kwargs)


def test_bench_protocol_on_tiny_components(pipe, monkeypatch):
    """bench_generate is batch-invariant and bench_quality reports the quality block."""
    from mmspec.vision import metrics

    torch.manual_seed(0)
    classifier = metrics.build_classifier().eval()
    monkeypatch.setattr(metrics, "load_bundled_classifier", lambda device="cpu": classifier)
    labels = pipe.bench_inputs(6, seed=0)
    assert labels == [0, 1, 2, 0, 1, 2]
    one, stats = pipe.bench_generate(labels, 1, 0, {"guidance_scale": 2.0})
    three, _ = pipe.bench_generate(labels, 3, 0, {"guidance_scale": 2.0})
    assert one == three and stats.tokens == 6 * 16
    quality = pipe.bench_quality(labels, one)
    parts = quality.pop("per_sample")
    assert set(quality) == {"class_acc", "fd", "fd_floor", "nll"}
    assert set(parts) == {"class_acc", "nll"}  # FD is a set statistic: its noise level is fd_floor
    for key, (numerators, denominators) in parts.items():  # the per-image parts add up to each figure
        assert len(numerators) == len(denominators) == len(labels)
        assert sum(numerators) / sum(denominators) == pytest.approx(quality[key], rel=1e-5)
    assert 0 <= quality["class_acc"] <= 1 and quality["fd"] >= 0 and quality["nll"] > 0
