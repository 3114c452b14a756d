"""Plugin registry: built-in plugins, config validation, registration rules, and third-party plugins
discovered through the `mmspec.plugins` entry-point group of a really installed package."""

import dataclasses
import importlib
import re
import sys

from pathlib import Path

import pytest
from tiny_models import perturbed_copy, tiny_llama
from toy_packages import install_package

import mmspec.common.registry as registry
from mmspec.common.pipeline import Pipeline
from mmspec.common.plugin import NoConfig, Plugin
from mmspec.common.loading import load_plugin
from mmspec.common.registry import get_plugin_class, list_plugins, make_config, modalities, register_plugin
from mmspec.common.structure import CodeGrid
from mmspec.text.pipeline import EOS_ID, VOCAB_SIZE, TextPipeline

PROMPTS = ["Return the", "A much longer prompt here"]


@pytest.fixture(scope="module")
def text_models():
    target = tiny_llama(vocab_size=VOCAB_SIZE, layers=2, seed=0)  # 258: the byte tokenizer's ids
    return target, perturbed_copy(target, noise=0.3)


@pytest.fixture
def pipe(text_models):
    target, draft = text_models
    return TextPipeline(target, draft_model=draft, eos_token_id=EOS_ID)


def ar_sequences(text_models, n=12):
    target, _ = text_models
    return TextPipeline(target, eos_token_id=EOS_ID)(PROMPTS, max_new_tokens=n).sequences


# --- built-in plugins -------------------------------------------------------------------------

def test_builtins_are_listed():
    names = list_plugins()
    assert "ar" in names and "speculative" in names
    assert names == sorted(names)


def test_list_plugins_by_modality():
    text = list_plugins("text")
    assert "speculative" in text and "ar" in text  # "any" plugins run on every modality
    vision = list_plugins("vision")
    assert "ar" in vision and "speculative" not in vision
    with pytest.raises(ValueError, match="modality must be one of"):
        list_plugins("audio")


@pytest.mark.parametrize("name", list_plugins())
def test_plugin_class_contract(name):
    cls = get_plugin_class(name)
    assert issubclass(cls, Plugin)
    assert cls.name == name
    assert cls.modality in modalities()
    assert isinstance(cls.lossless, bool)
    assert isinstance(cls.paper, str) and cls.paper.strip()
    assert dataclasses.is_dataclass(cls.Config)
    config = make_config(cls.Config, {})  # defaults validate
    assert isinstance(config, cls.Config)
    assert cls.build_decoder is not Plugin.build_decoder
    assert repr(cls()).startswith(cls.__name__ + "(")


def test_unknown_plugin_lists_available():
    with pytest.raises(KeyError, match="nope") as info:
        load_plugin("nope")
    message = str(info.value)
    for name in list_plugins():
        assert name in message


# --- config validation ----------------------------------------------------------------------

@pytest.mark.parametrize("value", [0, -1, 65, 2.0, 1.5, True, float("nan"), float("inf"), "3"])
def test_bad_num_draft_tokens(pipe, value):
    with pytest.raises(ValueError, match=re.escape("num_draft_tokens must be an int in [1, 64]")):
        load_plugin("speculative", pipeline=pipe, num_draft_tokens=value)


def test_huge_int_config_value_raises_value_error(pipe):
    with pytest.raises(ValueError, match="num_draft_tokens"):
        load_plugin("speculative", pipeline=pipe, num_draft_tokens=10 ** 400)


def test_unknown_config_key_lists_valid_fields(pipe):
    with pytest.raises(ValueError, match="num_draft_token") as info:
        load_plugin("speculative", pipeline=pipe, num_draft_token=3)
    assert "num_draft_tokens" in str(info.value) and "tree_branching" in str(info.value)
    with pytest.raises(ValueError, match=re.escape("valid: []")):
        load_plugin("ar", pipeline=pipe, k=1)


@pytest.mark.parametrize("text", ["a,b", "2,,2", "2.5", "3;2", " ", "2,0", "0", "-1", 0, -2, 2.5, None, [2, 2]])
def test_bad_tree_branching(pipe, text):
    with pytest.raises(ValueError, match="tree_branching"):
        load_plugin("speculative", pipeline=pipe, tree_branching=text)


def test_speculative_needs_a_draft_model(text_models):
    target, _ = text_models
    with pytest.raises(ValueError, match="draft_model"):
        load_plugin("speculative", pipeline=TextPipeline(target, eos_token_id=EOS_ID))


def test_plugin_rejects_a_pipeline_of_another_structure():
    class GridPipeline(Pipeline):
        modality = "toy-grid"
        draft_model = object()
        token_structure = CodeGrid(2, 2)

    with pytest.raises(ValueError, match="plugin 'speculative' decodes TokenSequence tokens; GridPipeline offers "
                                         "CodeGrid"):
        load_plugin("speculative", pipeline=GridPipeline())
    grid = GridPipeline()
    ar = load_plugin("ar", pipeline=grid)  # "any": every structure
    assert ar is not grid and ar.plugin.name == "ar" and grid.plugin is None
    with pytest.raises(TypeError, match="needs an mmspec Pipeline"):
        load_plugin("ar", pipeline=object())


@pytest.mark.parametrize("config", [dict(num_draft_tokens=1), dict(num_draft_tokens=4), dict(tree_branching="2,2")])
def test_speculative_greedy_matches_ar(text_models, pipe, config):
    out = load_plugin("speculative", pipeline=pipe, **config)
    assert out is not pipe and out.plugin.name == "speculative" and pipe.plugin is None
    assert out.model is pipe.model and out.draft_model is pipe.draft_model  # components shared, not copied
    res = out(PROMPTS, max_new_tokens=12)
    assert res.sequences == ar_sequences(text_models)
    assert all(isinstance(t, str) for t in res.texts)


# --- registration rules ---------------------------------------------------------------------

def test_register_rejects_duplicate_name():
    class Other(Plugin):
        modality = "text"
        paper = "x"

    with pytest.raises(ValueError, match="already registered"):
        register_plugin("ar")(Other)
    assert get_plugin_class("ar") is not Other
    # Re-registering the same class under its own name is harmless.
    ar = get_plugin_class("ar")
    assert register_plugin("ar")(ar) is ar


@pytest.mark.parametrize("missing", ["modality", "lossless", "paper", "Config"])
def test_register_rejects_class_missing_attribute(missing):
    attrs = {"modality": "text", "lossless": True, "paper": "x", "Config": NoConfig}
    del attrs[missing]
    cls = type("Incomplete", (), attrs)
    with pytest.raises(TypeError, match=missing):
        register_plugin("incomplete_test_plugin")(cls)
    assert "incomplete_test_plugin" not in list_plugins()


def test_register_rejects_bad_modality_and_name():
    class Unlabelled(Plugin):
        modality = ""

    with pytest.raises(ValueError, match="modality must be a non-empty string"):
        register_plugin("unlabelled_test_plugin")(Unlabelled)
    assert "unlabelled_test_plugin" not in list_plugins()
    with pytest.raises(ValueError, match="name"):
        register_plugin("")(Plugin)


# --- third-party plugins through entry points -------------------------------------------------

TOY_MODULE = '''
"""A third-party mmspec plugin: plain AR decoding with a validated (unused) setting."""
from dataclasses import dataclass

from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.plugin import Plugin
from mmspec.common.registry import field_range


@dataclass
class ToyConfig:
    depth: int = field_range(1, 8, default=2, doc="how deep the toy thinks")


class ToyPlugin(Plugin):
    modality = "text"
    lossless = True
    paper = "Toy et al. 2099"
    Config = ToyConfig

    def build_decoder(self, pipeline, request):
        return SpeculativeDecoder(request.target, None, logits=request.logits, eos_token_id=request.eos_token_id,
                                  pad_token_id=request.pad_token_id)
'''

BROKEN_MODULE = '''
raise ImportError("mmspec_toy_broken needs libfrobnicate")
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "mmspec-toy-plugin"
version = "0.0.1"

[project.entry-points."mmspec.plugins"]
toy = "mmspec_toy_plugin:ToyPlugin"
toy_broken = "mmspec_toy_broken:BrokenPlugin"

[tool.setuptools]
py-modules = ["mmspec_toy_plugin", "mmspec_toy_broken"]
'''


@pytest.fixture(scope="module")
def toy_site(tmp_path_factory):
    """A package declaring two mmspec plugins (one broken), installed into a private folder."""
    return install_package(tmp_path_factory, "toy", {"pyproject.toml": PYPROJECT, "mmspec_toy_plugin.py": TOY_MODULE,
                                                     "mmspec_toy_broken.py": BROKEN_MODULE})


@pytest.fixture
def toy_plugins(toy_site, monkeypatch):
    monkeypatch.syspath_prepend(str(toy_site))
    importlib.invalidate_caches()

    def cleanup():
        for name in ("toy", "toy_broken"):
            registry._REGISTRY.pop(name, None)
            registry._ENTRY_POINT_ERRORS.pop(name, None)
        for module in ("mmspec_toy_plugin", "mmspec_toy_broken"):
            sys.modules.pop(module, None)

    cleanup()
    yield registry.refresh_plugins()
    cleanup()


def test_entry_point_plugin_is_discovered_and_runs(toy_plugins, pipe, text_models):
    names = list_plugins()
    assert "toy" in names and "ar" in names and "speculative" in names
    assert "toy" in list_plugins("text") and "toy" not in list_plugins("vision")
    cls = get_plugin_class("toy")
    assert cls.__module__ == "mmspec_toy_plugin" and cls.name == "toy"
    toy = load_plugin("toy", pipeline=pipe, depth=3)
    assert toy.plugin.config.depth == 3
    out = toy(PROMPTS, max_new_tokens=12)
    assert len(out.texts) == 2 and all(isinstance(t, str) for t in out.texts)
    assert out.sequences == ar_sequences(text_models)
    for bad in (0, 9, 2.5):
        with pytest.raises(ValueError, match=re.escape("ToyConfig.depth must be an int in [1, 8]")):
            load_plugin("toy", pipeline=pipe, depth=bad)
    with pytest.raises(ValueError, match="valid: \\['depth'\\]"):
        load_plugin("toy", pipeline=pipe, width=2)


def test_broken_entry_point_does_not_break_others(toy_plugins, pipe):
    names = list_plugins()
    assert "toy_broken" not in names
    assert {"ar", "speculative", "toy"} <= set(names)
    with pytest.raises(ImportError, match="libfrobnicate"):
        load_plugin("toy_broken", pipeline=pipe)
    load_plugin("ar", pipeline=pipe)


def test_registry_is_clean_after_entry_point_tests():
    names = list_plugins()
    assert "toy" not in names and "toy_broken" not in names
    with pytest.raises(KeyError):
        get_plugin_class("toy_broken")


def test_declared_summaries_match_the_plugin_classes():
    """`mmspec list` reads the package's declared summaries instead of importing the plugins: each must say
    what its class says, and every registered plugin must have one."""
    from mmspec.common.registry import plugin_summaries

    summaries = {s.name: s for s in plugin_summaries()}
    assert set(summaries) == set(list_plugins())
    for name, summary in summaries.items():
        cls = get_plugin_class(name)
        assert (summary.modality, summary.lossless, summary.paper) == (cls.modality, cls.lossless, cls.paper), name
        assert summary.config_class() is cls.Config, name  # the CLI checks --set against the declared config
        assert summary.default_model == cls.default_model, name
        assert cls.__module__ == summary.module, name


def test_every_plugin_module_of_the_package_is_declared():
    """A plugin folder added without its line in the table would be invisible to `mmspec list` and the CLI."""
    import mmspec
    from mmspec.common.registry import plugin_summaries

    declared = {s.module for s in plugin_summaries() if s.module}
    on_disk = {f"mmspec.plugins.{p.parent.name}.plugin" for p in Path(mmspec.__file__).parent.glob("plugins/*/plugin.py")}
    assert on_disk == declared


def test_pipeline_specs_match_their_pipelines():
    """Each registered pipeline takes its call settings, input flags and `--out` suffixes from the spec the CLI
    checks before it loads."""
    from mmspec.common.config import config_defaults
    from mmspec.common.registry import get_pipeline_class, list_pipelines, pipeline_spec

    for name in list_pipelines():
        spec, cls = pipeline_spec(name), get_pipeline_class(name)
        if spec is None:
            continue
        assert cls.spec is spec, name
        assert cls.call_defaults == config_defaults(spec.call_settings), name
        assert cls.bench_settings == spec.bench_defaults, name
    assert {n for n in list_pipelines() if pipeline_spec(n) is not None} >= {"image", "asr", "tts", "docs", "text"}


def test_summaries_include_entry_point_plugins(toy_plugins):
    from mmspec.common.registry import plugin_summaries

    names = [s.name for s in plugin_summaries("text")]
    assert "toy" in names and "speculative" in names and "ssd" not in names
    with pytest.raises(ValueError, match="--modality must be one of"):
        plugin_summaries("smell")
