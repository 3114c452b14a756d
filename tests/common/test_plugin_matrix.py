"""The plugin × pipeline matrix (timm's habit): every registered lossless plugin (in its lossless
configuration) on every pipeline whose structure it accepts gives exactly plain AR's greedy tokens, and
every pipeline it does not accept is refused at load_plugin time with an error naming the plugin."""

import pytest
from pipelines import PIPELINES, inputs, pipeline, settings

from mmspec.common.loading import load_plugin
from mmspec.common.registry import get_plugin_class, list_plugins

NUM_INPUTS = 2


def lossless_plugins() -> list[tuple[str, dict]]:
    out = []
    for name in list_plugins():
        cls = get_plugin_class(name)
        if cls(**cls.lossless_config).lossless:
            out.append((name, dict(cls.lossless_config)))
    return out


# Pairs that must be compatible: a plugin that wrongly refused its own modality's models would otherwise
# pass the matrix by never running.
MUST_RUN = {("speculative", "text-tiny"), ("ctc_draft", "asr-tiny"), ("ctc_draft", "whisper-tiny-random"),
            ("sjd", "llamagen-tiny"), ("mc_sjd", "llamagen-tiny"), ("eagle", "llamagen-tiny"),
            ("ssd", "llamagen-tiny"), ("zipar", "llamagen-tiny"), ("sjd", "janus-tiny"), ("sjd", "emu3-tiny"),
            ("sjd", "chameleon-tiny"), ("rvq_spec", "tts-tiny"), ("ptp", "doc-tiny")}


def test_every_lossless_plugin_is_in_the_matrix():
    names = {name for name, _ in lossless_plugins()}
    assert {"ar", "speculative", "sjd", "mc_sjd", "eagle", "ssd", "zipar", "ctc_draft", "rvq_spec", "ptp"} <= names
    assert {p for p, _ in MUST_RUN} <= names and {m for _, m in MUST_RUN} <= set(PIPELINES)


@pytest.mark.parametrize("model", PIPELINES)
def test_lossless_plugins_equal_ar_greedy(model, torch_kernels):
    pipe = pipeline(model)
    prompts = inputs(model, NUM_INPUTS)
    greedy = settings(model, temperature=0.0)
    ar_sequences, _ = load_plugin("ar", pipeline=pipe).bench_generate(prompts, NUM_INPUTS, 0, greedy)
    ran, refused = [], []
    for name, config in lossless_plugins():
        try:
            accelerated = load_plugin(name, pipeline=pipe, **config)
        except ValueError as error:
            assert name in str(error), error  # the refusal names the plugin
            refused.append(name)
            continue
        sequences, stats = accelerated.bench_generate(prompts, NUM_INPUTS, 0, greedy)
        assert sequences == ar_sequences, f"{name} on {model} differs from plain AR"
        assert stats.num_rows == NUM_INPUTS
        ran.append(name)
    assert "ar" in ran
    for plugin, must_model in MUST_RUN:
        if must_model == model:
            assert plugin in ran, f"{plugin} refused {model}"
    print(f"{model}: ran {ran}, refused {refused}")
