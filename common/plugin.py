"""The Plugin base class: a decoding strategy with a validated config.

A plugin turns what a pipeline hands it for one generation (a `DecodeRequest`: the target adapter, the
logits pipeline, the token structure of this call, ...) into a `Decoder`. Pipelines call
`plugin.build_decoder(pipeline, request)` through their one hook, `Pipeline.run_decoder`, on every
generation. What a plugin needs from a pipeline is declared (`requires`, `needs_draft_model`) and checked
by `load_plugin` before any heavy work; nothing is probed.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from .config import NoConfig, make_config
from .decoder import Decoder
from .pipeline import Pipeline
from .request import DecodeRequest  # noqa: F401  (re-exported: plugins import it from here)
from .structure import TokenStructure, structure_names


class Plugin:
    name: str = "base"
    modality: str = "text"  # a label for listing and for the default bundled model; "any" runs everywhere
    lossless: bool = True
    lossless_config: dict = {}  # config that makes a plugin lossy by default lossless (e.g. a verified mode)
    paper: str = ""
    Config: type = NoConfig
    requires: type | tuple = TokenStructure  # the token structure(s) this plugin decodes
    needs_draft_model: bool = False  # the pipeline must carry a separate draft model
    default_model: str | None = None  # bundled model benchmarked by default (None: the modality's default)
    bench_variants: tuple = ()  # extra `mmspec bench --all` rows, e.g. ({"settings": {"window": 8}, "batch_size": 4,
    #                             "num_samples": 40},); keys default to batch 1, the pipeline's sample count and
    #                             the plugin's default model ("model": a bundled model name)
    bench_default_variants: tuple = ()  # replaces bench.ALL_VARIANTS for this plugin when not empty
    # "module:function" training the plugin's drafting weights for a pipeline (`mmspec train-head`):
    # function(pipeline, out, *, steps, batch_size, num_sequences, num_heldout, seed, eval_every, work_dir, log)
    # -> {"load_with": {config field: out}, held-out figures...}. None: nothing to train.
    head_trainer: str | None = None

    def __init__(self, **config):
        self.config = make_config(self.Config, config)
        self._check_paths()

    def _check_paths(self) -> None:
        """A `*_path` config field names a saved folder (config.json inside): a wrong one fails here, at
        load_plugin time, not at the first generation."""
        for name, value in asdict(self.config).items():
            if name.endswith("_path") and isinstance(value, (str, Path)) and str(value):
                if not (Path(value) / "config.json").is_file():
                    what = "no such folder" if not Path(value).exists() else "no config.json there"
                    raise ValueError(f"{name} {str(value)!r} is not a saved folder ({what}); give a folder written "
                                     f"by save_pretrained, or leave {name} empty for the bundled one")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in asdict(self.config).items())})"

    def check_pipeline(self, pipeline) -> None:
        """Raise a clear error if `pipeline` does not offer what this plugin declares it needs."""
        if not isinstance(pipeline, Pipeline):
            raise TypeError(f"plugin {self.name!r} needs an mmspec Pipeline, got {type(pipeline).__name__}")
        offered = pipeline.token_structure
        if not isinstance(offered, self.requires):
            raise ValueError(f"plugin {self.name!r} decodes {structure_names(self.requires)} tokens; "
                             f"{type(pipeline).__name__} offers {offered.describe()}")
        if self.needs_draft_model and pipeline.draft_model is None:
            raise ValueError(f"plugin {self.name!r} needs a draft model: give the pipeline draft_model=")

    def advice_when_nothing_saved(self, call: dict) -> list[str]:
        """What to change when this plugin's drafts were (almost) never accepted (`DecodeStats.saves_nothing`),
        most likely first; `call`: the pipeline settings of the run. Plugins add their own knobs."""
        hints = []
        if self.head_trainer is not None:
            hints.append(f"train its drafting weights for this model, longer or on more of its outputs (`mmspec "
                         f"train-head {self.name} --model MODEL --out DIR`, then load with the folder): a head "
                         "drafts only for the model it was trained on")
        if call.get("temperature", None) == 0:
            hints.append("sample (--set temperature=1): greedy decoding accepts a draft only where it is the "
                         "target's single top token, and many-valued outputs (image codes, audio frames) rarely "
                         "have one")
        hints.append("draft fewer tokens per step: with acceptance this low every drafted token is verify cost "
                     "that commits nothing")
        return hints

    def attach(self, pipeline):
        """A new pipeline that shares `pipeline`'s components and decodes with this plugin; the given one
        is left as it was."""
        self.check_pipeline(pipeline)
        return pipeline.with_plugin(self)

    def build_decoder(self, pipeline, request: DecodeRequest) -> Decoder:
        raise NotImplementedError

    # --- persistence (save_pretrained / from_pretrained of a pipeline) ----
    def save_pretrained(self, directory: Path) -> dict:
        """Write any trained weights this plugin decodes with under `directory` and return the config
        overrides that point at them (paths relative to `directory`); the default saves nothing."""
        return {}

    def bench_peer(self, pipeline, inputs, settings: dict) -> dict | None:
        """Optionally run a peer implementation of the same method for side-by-side numbers."""
        return None
