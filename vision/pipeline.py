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

    # --- bench protocol (see mmspec.common.bench) ------------------------
    bench_num_samples = 100

    def bench_inputs(self, num_samples: int, seed: int) -> list[int]:
        """Class labels, cycling through the classes."""
        return [i % self.num_classes for i in range(num_samples)]

    def bench_generate(self, inputs: list[int], batch_size: int, seed: int, settings: dict):
        """Image i always uses generator seed+i, whatever the batching. Returns code lists + stats."""
        sequences, stats = [], DecodeStats()
        disabled = getattr(self, "_progress_bar_config", {}).get("disable")
        self.set_progress_bar_config(disable=True)
        try:
            for start in range(0, len(inputs), batch_size):
                chunk = inputs[start:start + batch_size]
                gens = [torch.Generator().manual_seed(seed + start + i) for i in range(len(chunk))]
                out = self(class_labels=chunk, generator=gens, output_type="pt", **settings)
                sequences += out.tokens.tolist()
                stats = stats.merge(out.stats)
        finally:
            self.set_progress_bar_config(disable=disabled)
        return sequences, stats

    @torch.no_grad()
    def bench_quality(self, inputs: list[int], sequences: list[list[int]]) -> dict:
        """Class accuracy and Fréchet distance (bundled classifier) and target NLL of the codes.

        fd_floor is the distance between two disjoint sets of real held-out crops of the same size,
        the value a perfect generator would get at this sample count.
        """
        from . import metrics

        labels = torch.tensor(inputs)
        codes = torch.tensor(sequences, device=self.device)
        images = torch.cat([(decode_codes(self.vqvae, c.view(-1, self.grid_size, self.grid_size)) + 1) / 2
                            for c in codes.split(100)]).cpu()
        classifier = metrics.load_bundled_classifier(self.device)
        real_a, real_b = _real_reference_features(classifier, len(images))
        fake = metrics.features(classifier, images)
        return {"class_acc": metrics.class_accuracy(classifier, images, labels),
                "fd": metrics.frechet_distance(fake, real_a),
                "fd_floor": metrics.frechet_distance(real_b, real_a),
                "nll": metrics.target_nll(self.transformer, labels.to(self.device), codes)}

    def cli_generate(self, args, call: dict) -> int:
        """`mmspec generate PLUGIN --num N --out grid.png`: N images cycling through the classes."""
        from .data import CLASS_NAMES
        from .metrics import save_image_grid

        labels = self.bench_inputs(args.num, args.seed)
        codes, stats = self.bench_generate(labels, args.batch_size, args.seed, call)
        codes = torch.tensor(codes, device=self.device).view(-1, self.grid_size, self.grid_size)
        images = ((decode_codes(self.vqvae, codes) + 1) / 2).cpu()
        out = args.out or "grid.png"
        save_image_grid(images, rows=max(1, round(len(images) ** 0.5)), path=out)
        names = [CLASS_NAMES[c] if c < len(CLASS_NAMES) else str(c) for c in labels]
        print(f"wrote {len(images)} images to {out} (classes: {', '.join(names)})")
        print(stats)
        return 0

    @staticmethod
    def postprocess(images: torch.Tensor, output_type: str):
        if output_type == "pt":
            return images.cpu()
        array = images.permute(0, 2, 3, 1).float().cpu().numpy()
        if output_type == "np":
            return array
        return [PIL.Image.fromarray((a * 255).round().astype(np.uint8)) for a in array]


_REAL_FEATURES: dict = {}


def _real_reference_features(classifier, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two disjoint sets of n held-out real crops' features (cached per n)."""
    if n not in _REAL_FEATURES:
        from .data import CLASS_NAMES, make_crops
        from .metrics import features

        per_class = -(-2 * n // len(CLASS_NAMES))
        crops = make_crops("heldout", per_class, seed=1)
        order = torch.randperm(len(crops.images), generator=torch.Generator().manual_seed(0))
        images = crops.images[order].float() / 255
        _REAL_FEATURES[n] = (features(classifier, images[:n]), features(classifier, images[n:2 * n]))
    return _REAL_FEATURES[n]


def bundled_pipeline(device: str = "cpu") -> ARImagePipeline:
    """`llamagen-tiny`: the bundled LlamaGen-style GPT + VQ tokenizer trained on natural-photo crops."""
    from .tokenizer import BUNDLED_DIR, load_bundled_vq

    path = BUNDLED_DIR / "llamagen"
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"bundled image model not found under {path}; run examples/train_llamagen.py")
    transformer = LlamaGenModel.from_pretrained(path, torch_dtype=torch.float32).to(device).eval()
    pipe = ARImagePipeline(transformer, load_bundled_vq(device))
    pipe.model_name = "llamagen-tiny"
    return pipe


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
