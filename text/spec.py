"""The text pipeline's command-line face (`mmspec.common.pipeline_spec`), with no torch."""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.config import count_field, temperature_field, top_k_field, top_p_field
from mmspec.common.pipeline_spec import InputFlag, PipelineSpec


@dataclass
class TextCallSettings:
    max_new_tokens: int = count_field(96, doc="the longest completion, in tokens")
    temperature: float = temperature_field(0.0)
    top_k: int | None = top_k_field(None)
    top_p: float | None = top_p_field(None)


# `mmspec generate` prints every completion; `mmspec batch` is for more.
MAX_PRINTED = 256

TEXT_SPEC = PipelineSpec(modality="text", call_settings=TextCallSettings,
                         inputs=(InputFlag("--prompt", "text prompt (repeatable)"),), out_suffixes=(".json",),
                         num_ceiling=lambda args: None if args.prompt else (
                             MAX_PRINTED, "completions printed to the terminal; `mmspec batch` writes any number, "
                             "one file each"))
