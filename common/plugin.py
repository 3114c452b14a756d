"""The Plugin base class: a decoding strategy with a validated config.

A plugin turns a pipeline's target adapter into a `SpeculativeDecoder`
(drafter + acceptance rule). Pipelines call `plugin.build_decoder(...)` on
every generation, so one pipeline can switch plugins with `attach`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .decoder import SpeculativeDecoder
from .logits import LogitsPipeline
from .model import ARModel
from .registry import load_bundled_pipeline, make_config


@dataclass
class NoConfig:
    pass


class Plugin:
    name: str = "base"
    modality: str = "text"
    lossless: bool = True
    paper: str = ""
    Config: type = NoConfig
    bench_variants: tuple = ()  # extra `mmspec bench --all` rows, e.g. ({"settings": {"window": 8}, "batch_size": 4,
    #                             "num_samples": 40},); keys default to batch 1, the pipeline's sample count and
    #                             the plugin's default model ("model": a bundled model name)
    bench_default_variants: tuple = ()  # replaces bench.ALL_VARIANTS for this plugin when not empty

    def __init__(self, **config):
        self.config = make_config(self.Config, config)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in asdict(self.config).items())})"

    @classmethod
    def default_pipeline(cls, model: str | None = None, device: str = "cpu"):
        """The bundled pipeline this plugin is benchmarked on (`model` names one, None: the default)."""
        return load_bundled_pipeline(model, cls.modality, device)

    def attach(self, pipeline):
        modality = getattr(pipeline, "modality", None)
        if self.modality != "any" and modality != self.modality:
            raise ValueError(f"plugin {self.name!r} is for {self.modality} pipelines, got a {modality} pipeline "
                             f"({type(pipeline).__name__})")
        self.check_pipeline(pipeline)
        pipeline.plugin = self
        return pipeline

    def check_pipeline(self, pipeline) -> None:
        """Raise if the pipeline lacks what this plugin needs (e.g. a draft model)."""

    def build_decoder(self, pipeline, target: ARModel, logits: LogitsPipeline, *, eos_token_id=None,
                      pad_token_id: int = -1, grid: tuple[int, int] | None = None) -> SpeculativeDecoder:
        """grid: (rows, columns) of the code grid when the tokens form one (images), else None."""
        raise NotImplementedError

    def bench_peer(self, pipeline, inputs, settings: dict) -> dict | None:
        """Optionally run a peer implementation of the same method for side-by-side numbers."""
        return None
