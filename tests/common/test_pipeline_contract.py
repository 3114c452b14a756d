"""The shared pipeline tester (diffusers' PipelineTesterMixin habit), over every pipeline: save / load with
the attached plugin, batch 1 == batch N with per-sample generators, determinism, plugins side by side,
return_dict / output_type and bad settings."""

import inspect

import numpy as np
import pytest
import torch
from pipelines import PIPELINES, call, inputs, pipeline, settings

from mmspec.common.pipeline import Pipeline
from mmspec.common.loading import load_plugin
from mmspec.common.registry import get_plugin_class, list_plugins

pytestmark = pytest.mark.usefixtures("torch_kernels")  # the Triton interpreter is for the kernel tests

# The plugin each pipeline is saved with: the first of these it accepts (a trained head travels along; plain
# AR where no other plugin decodes the pipeline's tokens yet).
SAVE_WITH = ("eagle", "speculative", "ctc_draft", "sjd", "ptp", "ar")
NUM = 3


def attachable(pipe):
    for name in SAVE_WITH:
        try:
            return load_plugin(name, pipeline=pipe)
        except ValueError:
            continue
    raise AssertionError(f"no plugin of {SAVE_WITH} accepts {type(pipe).__name__}")


def sampled(pipe, name, batch_size, seed=0):
    sampling = {"temperature": 1.0} if "temperature" in pipe.call_defaults else {}
    if "max_new_tokens" in pipe.call_defaults:  # sampled text rarely stops early: keep the test short
        sampling["max_new_tokens"] = min(32, pipe.call_defaults["max_new_tokens"])
    return pipe.bench_generate(inputs(name, NUM), batch_size, seed, settings(name, **sampling))[0]


@pytest.mark.parametrize("model", PIPELINES)
def test_is_a_registered_pipeline(model):
    pipe = pipeline(model)
    assert isinstance(pipe, Pipeline) and pipe.modality and pipe.pipeline_name
    assert set(pipe.call_defaults) and pipe.plugin is None
    assert pipe.token_structure is not None
    assert any(get_plugin_class(p).modality == pipe.modality for p in list_plugins())


@pytest.mark.parametrize("model", PIPELINES)
def test_batch_one_equals_batch_n_and_seeds_repeat(model):
    pipe = attachable(pipeline(model))
    one = sampled(pipe, model, 1)
    assert sampled(pipe, model, NUM) == one  # per-sample generators: batching changes nothing
    assert sampled(pipe, model, NUM) == one  # same seed, same output
    assert sampled(pipe, model, NUM, seed=5) != one or model == "whisper-tiny-random"  # random weights: EOS


@pytest.mark.parametrize("model", PIPELINES)
def test_plugins_side_by_side(model):
    pipe = pipeline(model)
    accelerated = attachable(pipe)
    assert pipe.plugin is None and accelerated.plugin is not None and accelerated is not pipe
    ar = load_plugin("ar", pipeline=accelerated)
    assert ar.plugin.name == "ar" and ar.plugin is not accelerated.plugin and pipe.plugin is None
    progress = lambda p: getattr(p, "_progress_bar_config", getattr(p, "_progress", {})).get("desc")  # noqa: E731
    accelerated.set_progress_bar_config(disable=True, desc="mine")
    assert progress(pipe) != "mine" and progress(ar) != "mine"  # progress settings are per pipeline


@pytest.mark.parametrize("model", PIPELINES)
def test_save_and_load_keep_the_plugin(model, tmp_path):
    pipe = attachable(pipeline(model))
    if model == "whisper-tiny-random":  # its Hugging Face tokenizer here is an in-memory stand-in
        with pytest.raises(NotImplementedError, match="cannot be saved"):
            pipe.save_pretrained(tmp_path)
        return
    pipe.save_pretrained(tmp_path)
    loaded = type(pipe).from_pretrained(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    assert loaded.plugin.name == pipe.plugin.name and type(loaded.plugin.config) is type(pipe.plugin.config)
    assert sampled(loaded, model, NUM) == sampled(pipe, model, NUM)
    plain = load_plugin("ar", pipeline=pipe)
    plain.plugin = None
    plain.save_pretrained(tmp_path / "ar")  # a plain-AR folder loads as plain AR
    assert type(pipe).from_pretrained(tmp_path / "ar").plugin is None


@pytest.mark.parametrize("model", PIPELINES)
def test_return_dict_output_type_and_bad_settings(model):
    pipe = pipeline(model)
    items = inputs(model, 2)
    out = call(model, pipe, items)
    assert out.stats.num_rows == 2
    tup = call(model, pipe, items, return_dict=False)
    assert isinstance(tup, tuple)
    if hasattr(out, "audios"):
        audio = {kind: call(model, pipe, items, output_type=kind).audios for kind in ("pt", "np")}
        assert isinstance(audio["pt"][0], torch.Tensor) and isinstance(audio["np"][0], np.ndarray)
        assert [len(a) for a in audio["pt"]] == [len(a) for a in audio["np"]]
        with pytest.raises(ValueError, match="output_type must be one of"):
            call(model, pipe, items, output_type="wav")
    elif "output_type" in inspect.signature(pipe.__call__).parameters:
        shapes = {kind: call(model, pipe, items, output_type=kind).images for kind in ("pt", "np", "pil")}
        assert shapes["pt"].shape[0] == 2 and shapes["np"].shape[:1] == (2,) and len(shapes["pil"]) == 2
        assert tuple(shapes["pt"].shape[2:]) == shapes["np"].shape[1:3] == shapes["pil"][0].size[::-1]
        with pytest.raises(ValueError, match="output_type must be one of"):
            call(model, pipe, items, output_type="jpeg")
    with pytest.raises(ValueError, match="temperature must be a number >= 0"):
        call(model, pipe, items, temperature=-1.0)
    with torch.no_grad():
        assert call(model, pipe, items).stats.num_rows == 2  # still usable after the errors
