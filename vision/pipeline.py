"""ARImagePipeline: class-conditional image generation by any decoding plugin, diffusers-style."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import PIL.Image
import torch
from diffusers import DiffusionPipeline, VQModel
from diffusers.utils import BaseOutput

from mmspec.common.logits import LogitsPipeline, check_generators
from mmspec.common.model import ARModel, CFGModel
from mmspec.common.stats import DecodeStats

from .llamagen import LlamaGenAdapter, LlamaGenModel
from .tokenizer import decode_codes

OUTPUT_TYPES = ("pil", "np", "pt")


@dataclass
class ARImagePipelineOutput(BaseOutput):
    images: list | np.ndarray | torch.Tensor  # PIL list, [N, H, W, 3] float in [0, 1], or [N, 3, H, W]
    tokens: torch.Tensor  # [N, grid*grid] long; the generated codes
    stats: DecodeStats


class ARImagePipeline(DiffusionPipeline):
    """transformer: a `LlamaGenModel`; vqvae: the diffusers `VQModel` whose codes it predicts.

    The decoding strategy is a plugin (`mmspec.load_plugin(name, pipeline=pipe)`), plain AR by default.
    """

    modality = "vision"
    model_cpu_offload_seq = "transformer->vqvae"
    _callback_tensor_inputs = ["tokens"]
    call_defaults = {"guidance_scale": 3.0, "temperature": 1.0, "top_k": None, "top_p": None}

    def __init__(self, transformer: LlamaGenModel, vqvae: VQModel):
        super().__init__()
        self.register_modules(transformer=transformer, vqvae=vqvae)
        self.plugin = None

    @property
    def num_classes(self) -> int:
        return self.transformer.config.num_classes

    @property
    def grid_size(self) -> int:
        return self.transformer.grid_size

    def target_adapter(self) -> ARModel:
        return LlamaGenAdapter(self.transformer)

    def check_inputs(self, class_labels, guidance_scale, num_images_per_prompt, output_type):
        if class_labels is None:
            raise ValueError("class_labels is required: an int or a list of ints in "
                             f"[0, {self.num_classes - 1}]")
        labels = [class_labels] if isinstance(class_labels, int) else list(class_labels)
        if not labels or not all(isinstance(c, int) and not isinstance(c, bool) for c in labels):
            raise ValueError(f"class_labels must be an int or a non-empty list of ints, got {class_labels!r}")
        bad = [c for c in labels if not 0 <= c < self.num_classes]
        if bad:
            raise ValueError(f"class_labels {bad} out of range: allowed 0..{self.num_classes - 1}")
        if not isinstance(guidance_scale, (int, float)) or not guidance_scale >= 1:
            raise ValueError(f"guidance_scale must be >= 1 (1 disables classifier-free guidance), "
                             f"got {guidance_scale!r}")
        if not isinstance(num_images_per_prompt, int) or num_images_per_prompt < 1:
            raise ValueError(f"num_images_per_prompt must be an int >= 1, got {num_images_per_prompt!r}")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")
        return labels

    @torch.no_grad()
    def __call__(self, class_labels=None, guidance_scale: float = 3.0, num_images_per_prompt: int = 1,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, generator=None,
                 output_type: str = "pil", return_dict: bool = True, callback_on_step_end=None):
        labels = self.check_inputs(class_labels, guidance_scale, num_images_per_prompt, output_type)
        labels = torch.tensor([c for c in labels for _ in range(num_images_per_prompt)], device=self.device)
        generator = check_generators(generator, len(labels))
        logits = LogitsPipeline(temperature=temperature, top_k=top_k, top_p=top_p)
        cond = self.transformer.class_token(labels)[:, None]
        target, prefill = self.target_adapter(), None
        if guidance_scale != 1:
            uncond = self.transformer.class_token(torch.full_like(labels, self.transformer.null_class))[:, None]
            target, prefill = CFGModel(target, guidance_scale), (torch.cat([cond, uncond]), None)
        if self.plugin is None:
            from mmspec.common.registry import get_plugin_class

            self.plugin = get_plugin_class("ar")()
        decoder = self.plugin.build_decoder(self, target, logits)
        total = self.grid_size ** 2
        with self.progress_bar(total=total * len(labels)) as bar:
            def on_step(step, info):
                bar.update(int((info["num_accepted"] + 1).sum()))
                if callback_on_step_end is not None:
                    callback_on_step_end(self, step, None, {"tokens": info["tokens"]})

            out = decoder.generate(cond, max_new_tokens=total, generator=generator, prefill_input=prefill,
                                   callback=on_step)
        codes = out.sequences.view(-1, self.grid_size, self.grid_size)
        images = (decode_codes(self.vqvae, codes) + 1) / 2
        images = self.postprocess(images, output_type)
        if not return_dict:
            return images, out.stats
        return ARImagePipelineOutput(images=images, tokens=out.sequences, stats=out.stats)

    @staticmethod
    def postprocess(images: torch.Tensor, output_type: str):
        if output_type == "pt":
            return images.cpu()
        array = images.permute(0, 2, 3, 1).float().cpu().numpy()
        if output_type == "np":
            return array
        return [PIL.Image.fromarray((a * 255).round().astype(np.uint8)) for a in array]


def image_grid(images: list, rows: int) -> PIL.Image.Image:
    """Tile PIL images row-major into one picture."""
    cols = -(-len(images) // rows)
    w, h = images[0].size
    grid = PIL.Image.new("RGB", (cols * w, rows * h), "white")
    for i, img in enumerate(images):
        grid.paste(img, ((i % cols) * w, (i // cols) * h))
    return grid


def save_grid(images: list, rows: int, path: str | Path) -> None:
    image_grid(images, rows).save(path)
