"""The image pipeline's command-line face (`mmspec.common.pipeline_spec`), with no torch."""

from __future__ import annotations

from dataclasses import dataclass

from mmspec.common.config import field_range, temperature_field, top_k_field, top_p_field
from mmspec.common.pipeline_spec import InputFlag, PipelineSpec


# One grid picture of at most this many images (at 512 px each, about 70 M pixels: under PIL's 89 M
# decompression-bomb limit, so the picture opens anywhere).
GRID_MAX_IMAGES = 256


def check_class_label(label) -> None:
    if label < 0:
        raise ValueError("a class label is an int >= 0")


@dataclass
class ImageCallSettings:
    guidance_scale: float = field_range(1.0, None, default=3.0,
                                        doc="classifier-free guidance scale (1 disables guidance)")
    temperature: float = temperature_field(1.0)
    top_k: int | None = top_k_field(None)
    top_p: float | None = top_p_field(None)


IMAGE_SPEC = PipelineSpec(
    modality="vision", call_settings=ImageCallSettings,
    inputs=(InputFlag("--class-label", "class-conditional model: class to generate (repeatable): --num images cycle "
                      "through the given classes (default: through all classes)", type=int, check=check_class_label),
            InputFlag("--prompt", "text-to-image model: prompt (repeatable): --num images cycle through the given "
                      "prompts (default: through built-in captions)")),
    out_suffixes=(".png", ".jpg", ".jpeg", ".webp"),
    num_ceiling=lambda args: (GRID_MAX_IMAGES, "`mmspec generate` draws every image into one grid picture; "
                              "`mmspec batch` writes any number, one file each"))
