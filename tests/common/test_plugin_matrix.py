"""The plugin × pipeline matrix (timm's habit), one test ID per pair (`-k eagle` selects eagle's): every
registered lossless plugin (in its lossless configuration) on every pipeline whose structure it accepts gives
exactly plain AR's greedy tokens; a pipeline it does not accept is refused at load_plugin time with an error
naming the plugin, and the pair is skipped with that error as its reason. Derived, not hand-kept: every
lossless plugin must run on its own default model, so a plugin that refused everything cannot pass by never
running."""

import functools

import pytest
from pipelines import PIPELINES, inputs, pipeline, settings

from mmspec.common.loading import load_plugin, resolve_model
from mmspec.common.registry import get_plugin_class, list_plugins

NUM_INPUTS = 2


def lossless_plugins() -> list[tuple[str, dict]]:
    out = []
    for name in list_plugins():
        cls = get_plugin_class(name)
        if cls(**cls.lossless_config).lossless:
            out.append((name, dict(cls.lossless_config)))
    return out


LOSSLESS = lossless_plugins()
PAIRS = [(name, config, model) for name, config in LOSSLESS for model in PIPELINES]


@functools.lru_cache(maxsize=None)
def ar_greedy(model: str) -> list[list[int]]:
    return load_plugin("ar", pipeline=pipeline(model)).bench_generate(
        inputs(model, NUM_INPUTS), NUM_INPUTS, 0, settings(model, temperature=0.0))[0]


def test_the_matrix_holds_every_lossless_plugin_and_model():
    names = {name for name, _ in LOSSLESS}
    assert {"ar", "speculative", "sjd", "mc_sjd", "eagle", "ssd", "zipar", "ctc_draft", "rvq_spec", "ptp"} <= names
    assert {"llamagen-tiny", "text-tiny", "asr-tiny", "tts-tiny", "doc-tiny", "janus-tiny"} <= set(PIPELINES)


@pytest.mark.parametrize("name, config", LOSSLESS, ids=[name for name, _ in LOSSLESS])
def test_every_lossless_plugin_runs_on_its_own_default_model(name, config):
    cls = get_plugin_class(name)
    model, _, _ = resolve_model(cls.default_model, cls.modality)
    load_plugin(name, pipeline=pipeline(model), **config)  # raises if it refuses


@pytest.mark.parametrize("name, config, model", PAIRS, ids=[f"{name}-{model}" for name, _, model in PAIRS])
def test_a_lossless_plugin_equals_ar_greedy(name, config, model):
    try:
        accelerated = load_plugin(name, pipeline=pipeline(model), **config)
    except ValueError as error:
        assert name in str(error), error  # the refusal names the plugin
        pytest.skip(f"refused: {error}")
    sequences, stats = accelerated.bench_generate(inputs(model, NUM_INPUTS), NUM_INPUTS, 0,
                                                  settings(model, temperature=0.0))
    assert sequences == ar_greedy(model), f"{name} on {model} differs from plain AR"
    assert stats.num_rows == NUM_INPUTS
