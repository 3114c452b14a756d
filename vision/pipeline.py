"""ARImagePipeline: class-conditional or text-to-image generation by any decoding plugin, diffusers-style.

The pipeline's `transformer` is either

- our class-conditional `LlamaGenModel` (with a diffusers `VQModel` as `vqvae`): `pipe(class_labels=...)`;
- a transformers image-generating multimodal model with a `tokenizer`: `pipe(prompt=...)`.
  `JanusForConditionalGeneration` and `Emu3ForConditionalGeneration` decode with their own VQ models;
  `ChameleonForConditionalGeneration` needs `vqvae` (transformers ships Chameleon's VQ encoder only).

Per-model choices for prompts (LM ids, before `adapter.prompt_ids`; see `mmspec.vision.hf_adapters`):

==========  ===================================  ==============================  ==============================
model       prompt                               unconditional row (CFG)         image size
==========  ===================================  ==============================  ==============================
Janus       BOS text <begin_of_image>            Janus's own: every token but    vq_config.num_patches² codes
            (JanusProcessor, image mode)         BOS/BOI -> pad (its generate)   (= vision num_image_tokens)
Emu3        BOS text <|image start|>H*W          the prompt's last token alone   height × width pixels, H, W
            <|image token|> (Emu3Processor)      (its generate without a         codes = pixels / VQ factor;
                                                 negative prompt)                default 90×90 codes
Chameleon   BOS text <racm3:break>               [BOS, <racm3:break>] (Meta's    (vq resolution / VQ factor)²
            (Meta's image decoder)               chameleon image CFG)            codes
==========  ===================================  ==============================  ==============================

With `negative_prompt`, the unconditional rows are the negative prompts formatted like the prompts (Emu3's
reference pipeline does this for its negative prompt; for Janus and Chameleon it is an extension).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import PIL.Image
import torch
from diffusers import DiffusionPipeline, VQModel
from diffusers.utils import BaseOutput

from mmspec.common.logits import LogitsPipeline, check_generators
from mmspec.common.model import ARModel, CFGModel
from mmspec.common.pipeline import Pipeline
from mmspec.common.plugin import DecodeRequest
from mmspec.common.stats import DecodeStats
from mmspec.common.structure import CodeGrid

from .llamagen import LlamaGenAdapter, LlamaGenModel
from .tokenizer import codebook, decode_codes

OUTPUT_TYPES = ("pil", "np", "pt")
# transformers model class -> model kind, for the text-to-image models the pipeline drives.
T2I_MODEL_CLASSES = {"JanusForConditionalGeneration": "janus", "Emu3ForConditionalGeneration": "emu3",
                     "ChameleonForConditionalGeneration": "chameleon"}
EMU3_DEFAULT_GRID = 90  # Emu3Processor's default size: ratio 1:1, image_area 720², 8 px per code -> 90x90 codes
# Image-start tokens when the tokenizer does not name them (the processors' own defaults).
_BOI_TOKENS = {"janus": "<begin_of_image>", "emu3": "<|image start|>", "chameleon": "<racm3:break>"}
EMU3_IMAGE_WRAPPER = "<|image token|>"


@dataclass
class ARImagePipelineOutput(BaseOutput):
    images: list | np.ndarray | torch.Tensor  # PIL list, [N, H, W, 3] float in [0, 1], or [N, 3, H, W]
    tokens: torch.Tensor  # [N, rows*cols] long; the generated codes (codebook indices, row-major)
    stats: DecodeStats


def transformer_kind(transformer) -> str:
    """"llamagen" for a `LlamaGenModel`, else "janus" / "emu3" / "chameleon" by transformers model class."""
    if isinstance(transformer, LlamaGenModel):
        return "llamagen"
    import transformers

    for name, kind in T2I_MODEL_CLASSES.items():
        cls = getattr(transformers, name, None)
        if cls is not None and isinstance(transformer, cls):
            return kind
    raise TypeError(f"transformer must be a LlamaGenModel or one of transformers' {', '.join(T2I_MODEL_CLASSES)}, "
                    f"got {type(transformer).__name__}")


def _vq_upsampling(vq: VQModel) -> int:
    """Pixels per code of a diffusers VQModel (its decoder upsamples once per block but the last)."""
    return 2 ** (len(vq.config.block_out_channels) - 1)


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids, mask


def _as_prompt_list(value, name: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{name} must be a string or a non-empty list of strings, got {value!r}")
    return list(texts)


class ARImagePipeline(DiffusionPipeline, Pipeline):
    """Autoregressive image generation; the decoding strategy is a plugin
    (`mmspec.load_plugin(name, pipeline=pipe)`), plain AR by default.

    transformer: a `LlamaGenModel` (class-conditional; `vqvae`, the diffusers `VQModel` whose codes it
    predicts, is required), or a transformers `JanusForConditionalGeneration` / `Emu3ForConditionalGeneration`
    (their own VQ models decode; `vqvae` must be None) / `ChameleonForConditionalGeneration` (transformers has
    no Chameleon VQ decoder: `vqvae` is a diffusers `VQModel` with Chameleon's codebook, e.g. its VQGAN decoder
    converted). tokenizer: the transformers tokenizer of the text-to-image model, needed for `prompt`.
    """

    modality = "vision"
    pipeline_name = "image"
    model_cpu_offload_seq = "transformer->vqvae"
    _optional_components = ["vqvae", "tokenizer"]
    _callback_tensor_inputs = ["tokens"]
    call_defaults = {"guidance_scale": 3.0, "temperature": 1.0, "top_k": None, "top_p": None}

    def __init__(self, transformer, vqvae: VQModel | None = None, tokenizer=None):
        super().__init__()
        kind = transformer_kind(transformer)
        if kind in ("llamagen", "chameleon") and vqvae is None:
            why = ("the class-conditional LlamaGenModel predicts a VQModel's codes" if kind == "llamagen" else
                   "transformers' Chameleon has no VQ decoder; pass a diffusers VQModel with its codebook")
            raise ValueError(f"vqvae is required: {why}")
        if kind in ("janus", "emu3") and vqvae is not None:
            raise ValueError(f"vqvae must be None for {type(transformer).__name__}: it decodes with its own VQ model")
        if kind == "chameleon":
            codes = len(transformer.model.vocabulary_mapping.image_tokens)
            if vqvae.config.num_vq_embeddings != codes:
                raise ValueError(f"vqvae has {vqvae.config.num_vq_embeddings} codes, the model's image vocabulary "
                                 f"has {codes}")
        if kind == "janus":
            config = transformer.config
            if config.vision_config.num_image_tokens != config.vq_config.num_patches ** 2:
                raise ValueError(f"inconsistent Janus config: vision_config.num_image_tokens = "
                                 f"{config.vision_config.num_image_tokens} but the VQ decoder takes "
                                 f"vq_config.num_patches² = {config.vq_config.num_patches ** 2} codes")
        self.register_modules(transformer=transformer, vqvae=vqvae, tokenizer=tokenizer)
        self.plugin = None

    # --- persistence: diffusers' folders, plus the attached plugin ---------
    def save_pretrained(self, save_directory, **kwargs):
        super().save_pretrained(save_directory, **kwargs)
        self.save_plugin(save_directory)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        pipe = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        if os.path.isdir(pretrained_model_name_or_path):
            pipe.plugin = cls.load_saved_plugin(pretrained_model_name_or_path)
        return pipe

    @property
    def token_structure(self) -> CodeGrid:
        """The code grid of an image at the model's default size, with the codebook's latents."""
        rows, cols = self.code_grid()
        return CodeGrid(rows, cols, latents=self.codebook())

    # --- what the transformer is -------------------------------------------
    @property
    def model_kind(self) -> str:
        """"llamagen", "janus", "emu3" or "chameleon"."""
        return transformer_kind(self.transformer)

    @property
    def is_class_conditional(self) -> bool:
        return self.model_kind == "llamagen"

    @property
    def num_classes(self) -> int | None:
        """Number of classes of a class-conditional model (None for text-to-image models)."""
        return self.transformer.config.num_classes if self.is_class_conditional else None

    @property
    def grid_size(self) -> int:
        """Codes per image side (Emu3: the default; its size is chosen per call)."""
        kind = self.model_kind
        if kind == "llamagen":
            return self.transformer.grid_size
        if kind == "janus":
            return self.transformer.config.vq_config.num_patches
        if kind == "chameleon":
            vq = self.transformer.config.vq_config
            return vq.resolution // 2 ** (len(vq.channel_multiplier) - 1)
        return EMU3_DEFAULT_GRID

    @property
    def vq_scale_factor(self) -> int:
        """Pixels per code along each side."""
        kind = self.model_kind
        if kind == "janus":
            return 2 ** (len(self.transformer.config.vq_config.channel_multiplier) - 1)
        if kind == "emu3":
            return int(self.transformer.model.vqmodel.spatial_scale_factor)
        return _vq_upsampling(self.vqvae)

    def code_grid(self, height: int | None = None, width: int | None = None) -> tuple[int, int]:
        """(rows, cols) of codes for an image of height x width pixels (None: the model's size).

        Emu3 generates any size (multiples of `vq_scale_factor` pixels; default 90x90 codes, Emu3Processor's
        default); the other models have one size.
        """
        factor = self.vq_scale_factor
        if self.model_kind == "emu3":
            sizes = []
            for name, value in (("height", height), ("width", width)):
                if value is None:
                    value = EMU3_DEFAULT_GRID * factor
                if not isinstance(value, int) or isinstance(value, bool) or value < factor or value % factor:
                    raise ValueError(f"{name} must be a positive multiple of {factor} pixels (one code), "
                                     f"got {value!r}")
                sizes.append(value // factor)
            return sizes[0], sizes[1]
        side = self.grid_size * factor
        if height not in (None, side) or width not in (None, side):
            raise ValueError(f"{type(self.transformer).__name__} generates {side}x{side} images only: height and "
                             f"width must be None or {side}, got {height!r} x {width!r}")
        return self.grid_size, self.grid_size

    def codebook(self) -> torch.Tensor:
        """[N, D] the VQ codebook: the latent vector of every image code (methods that compare codes by latent)."""
        if self.model_kind in ("janus", "emu3"):
            return self.transformer.model.vqmodel.quantize.embedding.weight.detach()
        return codebook(self.vqvae)

    def target_adapter(self, grid_width: int | None = None) -> ARModel:
        """The ARModel the decoding plugins verify with; its vocabulary is the image codebook.

        grid_width: codes per image row (Emu3 only, which writes an end-of-line token after each row;
        default: `grid_size`).
        """
        kind = self.model_kind
        if kind == "llamagen":
            return LlamaGenAdapter(self.transformer)
        from .hf_adapters import ChameleonImageAdapter, Emu3ImageAdapter, JanusImageAdapter

        if kind == "janus":
            return JanusImageAdapter(self.transformer, boi_token_id=self._janus_boi_id())
        if kind == "emu3":
            return Emu3ImageAdapter(self.transformer, width=self.grid_size if grid_width is None else grid_width)
        return ChameleonImageAdapter(self.transformer)

    # --- prompts -----------------------------------------------------------
    def _require_prompt_support(self) -> None:
        if self.is_class_conditional or self.tokenizer is None:
            raise ValueError("prompt needs a text-to-image model and a tokenizer: "
                             + ("this pipeline's transformer is a class-conditional LlamaGenModel (use class_labels)"
                                if self.is_class_conditional else "this pipeline has no tokenizer"))

    def _special_id(self, attribute: str, default: str) -> int:
        token = getattr(self.tokenizer, attribute, None) or default
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or (token_id == self.tokenizer.unk_token_id and token != self.tokenizer.unk_token):
            raise ValueError(f"the tokenizer has no {token!r} token, which {type(self.transformer).__name__} "
                             f"prompts need")
        return int(token_id)

    def _janus_boi_id(self) -> int | None:
        """Janus's generate recognises <begin_of_image> by its generation config's id; the tokenizer's otherwise."""
        gen_kwargs = getattr(self.transformer.generation_config, "generation_kwargs", None) or {}
        boi = gen_kwargs.get("boi_token_id")
        if boi is None and self.tokenizer is not None:
            boi = self._special_id("boi_token", _BOI_TOKENS["janus"])
        return None if boi is None else int(boi)

    def _bos_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        if bos is None:
            bos = getattr(self.transformer.generation_config, "bos_token_id", None)
        if bos is None:
            raise ValueError("neither the tokenizer nor the model's generation config has a BOS token")
        return int(bos)

    def _text_ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def tokenize_prompt(self, prompt, height: int | None = None, width: int | None = None) -> list[list[int]]:
        """Language-model ids of each prompt, as the model's processor builds image-generation prompts:
        BOS + text + the image-start suffix (see the module docstring). height/width matter for Emu3 only.

        The tokenizer's own special tokens are not added (BOS is added here, once); the image-start tokens
        come from the tokenizer's `boi_token` (and Emu3's `image_wrapper_token`) or the processors' defaults.
        """
        self._require_prompt_support()
        texts = _as_prompt_list(prompt, "prompt")
        kind = self.model_kind
        bos = self._bos_id()
        if kind == "janus":
            suffix = [self._janus_boi_id()]
        elif kind == "emu3":
            rows, cols = self.code_grid(height, width)
            suffix = ([self._special_id("boi_token", _BOI_TOKENS[kind])] + self._text_ids(f"{rows}*{cols}")
                      + [self._special_id("image_wrapper_token", EMU3_IMAGE_WRAPPER)])
        else:
            suffix = [self._special_id("boi_token", _BOI_TOKENS[kind])]
        rows = [[bos] + self._text_ids(t) + suffix for t in texts]
        self._check_text_ids(rows)
        return rows

    def _check_text_ids(self, rows: list[list[int]]) -> None:
        flat = torch.tensor([i for r in rows for i in r], dtype=torch.long)
        vocab = self.transformer.get_input_embeddings().num_embeddings
        if bool(((flat < 0) | (flat >= vocab)).any()):
            raise ValueError(f"the tokenizer produced ids outside the model's text vocabulary (0..{vocab - 1}): "
                             f"{sorted(set(flat[(flat < 0) | (flat >= vocab)].tolist()))}")
        if self.model_kind in ("emu3", "chameleon"):
            mapping = self.transformer.model.vocabulary_mapping
            image = set(mapping.image_tokens) & set(flat.tolist())
            if image:
                raise ValueError(f"the tokenized prompt contains image-token ids {sorted(image)}")

    def _unconditional_rows(self, rows: list[list[int]], negative: list[str] | None,
                            height: int | None, width: int | None) -> list[list[int]]:
        """LM ids of the unconditional (CFG) prompt of each row (Janus without negative prompt: see __call__)."""
        if negative is not None:
            return self.tokenize_prompt(negative, height, width)
        if self.model_kind == "emu3":
            # Emu3's generate(guidance_scale=s) without negative_prompt_ids: the prompt's last token alone.
            return [r[-1:] for r in rows]
        # Chameleon (Meta's image decoder): [BOS, <racm3:break>], the formatted empty prompt.
        return self.tokenize_prompt([""] * len(rows))

    # --- inputs ------------------------------------------------------------
    def check_inputs(self, class_labels, guidance_scale, num_images_per_prompt, output_type, prompt=None,
                     negative_prompt=None, height=None, width=None):
        """Validate a call; returns the class labels (class-conditional) or the prompts (text-to-image)."""
        if class_labels is not None and prompt is not None:
            raise ValueError("pass exactly one of class_labels and prompt, not both (class_labels for "
                             "class-conditional models, prompt for text-to-image models)")
        if class_labels is not None and not self.is_class_conditional:
            raise ValueError(f"class_labels is only for class-conditional models (LlamaGenModel); this pipeline's "
                             f"{type(self.transformer).__name__} takes prompt=")
        if prompt is not None or negative_prompt is not None:
            self._require_prompt_support()
        if self.is_class_conditional:
            if class_labels is None:
                raise ValueError("class_labels is required: an int or a list of ints in "
                                 f"[0, {self.num_classes - 1}]")
            labels = [class_labels] if isinstance(class_labels, int) else list(class_labels)
            if not labels or not all(isinstance(c, int) and not isinstance(c, bool) for c in labels):
                raise ValueError(f"class_labels must be an int or a non-empty list of ints, got {class_labels!r}")
            bad = [c for c in labels if not 0 <= c < self.num_classes]
            if bad:
                raise ValueError(f"class_labels {bad} out of range: allowed 0..{self.num_classes - 1}")
            inputs = labels
        else:
            if prompt is None:
                raise ValueError("prompt is required: a string or a list of strings")
            inputs = _as_prompt_list(prompt, "prompt")
        if not isinstance(guidance_scale, (int, float)) or not guidance_scale >= 1:
            raise ValueError(f"guidance_scale must be >= 1 (1 disables classifier-free guidance), "
                             f"got {guidance_scale!r}")
        if negative_prompt is not None:
            negatives = _as_prompt_list(negative_prompt, "negative_prompt")
            if len(negatives) not in (1, len(inputs)):
                raise ValueError(f"negative_prompt must be one string or one per prompt ({len(inputs)}), "
                                 f"got {len(negatives)}")
            if guidance_scale == 1:
                raise ValueError("negative_prompt needs classifier-free guidance (guidance_scale > 1)")
        if not isinstance(num_images_per_prompt, int) or num_images_per_prompt < 1:
            raise ValueError(f"num_images_per_prompt must be an int >= 1, got {num_images_per_prompt!r}")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")
        if height is not None or width is not None or not self.is_class_conditional:
            self.code_grid(height, width)
        return inputs

    @torch.no_grad()
    def __call__(self, class_labels=None, guidance_scale: float = 3.0, num_images_per_prompt: int = 1,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, generator=None,
                 output_type: str = "pil", return_dict: bool = True, callback_on_step_end=None, *,
                 prompt=None, negative_prompt=None, height: int | None = None, width: int | None = None):
        """Generate images for `class_labels` (class-conditional transformer) or `prompt` (text-to-image).

        guidance_scale: classifier-free guidance u + s·(c − u) (1: none). negative_prompt (text-to-image, with
        guidance): one string or one per prompt, the unconditional prompts; default: the model's own
        unconditional prompt (module docstring). num_images_per_prompt: images per label / prompt, consecutive.
        generator: one, or one per image (then image i's randomness depends on generator i only).
        height, width: pixels; only Emu3 takes other sizes than its fixed one.
        """
        inputs = self.check_inputs(class_labels, guidance_scale, num_images_per_prompt, output_type,
                                   prompt=prompt, negative_prompt=negative_prompt, height=height, width=width)
        if not self.is_class_conditional:
            return self._generate_from_prompts(inputs, negative_prompt, guidance_scale, num_images_per_prompt,
                                               temperature, top_k, top_p, generator, output_type, return_dict,
                                               callback_on_step_end, height, width)
        labels = torch.tensor([c for c in inputs for _ in range(num_images_per_prompt)], device=self.device)
        generator = check_generators(generator, len(labels))
        logits = LogitsPipeline(temperature=temperature, top_k=top_k, top_p=top_p)
        cond = self.transformer.class_token(labels)[:, None]
        target, prefill = self.target_adapter(), None
        if guidance_scale != 1:
            uncond = self.transformer.class_token(torch.full_like(labels, self.transformer.null_class))[:, None]
            target, prefill = CFGModel(target, guidance_scale), (torch.cat([cond, uncond]), None)
        out = self._run_decoder(target, logits, cond, None, prefill, (self.grid_size, self.grid_size), generator,
                                callback_on_step_end)
        codes = out.sequences.view(-1, self.grid_size, self.grid_size)
        images = (decode_codes(self.vqvae, codes) + 1) / 2
        images = self.postprocess(images, output_type)
        if not return_dict:
            return images, out.stats
        return ARImagePipelineOutput(images=images, tokens=out.sequences, stats=out.stats)

    def _run_decoder(self, target, logits, input_ids, attention_mask, prefill, grid, generator, callback):
        request = DecodeRequest(target, logits, CodeGrid(grid[0], grid[1], latents=self.codebook()))
        total = grid[0] * grid[1]
        with self.progress_bar(total=total * input_ids.shape[0]) as bar:
            def on_step(step, info):
                bar.update(int((info["num_accepted"] + 1).sum()))
                if callback is not None:
                    callback(self, step, None, {"tokens": info["tokens"]})

            return self.run_decoder(request, input_ids, attention_mask, max_new_tokens=total, generator=generator,
                                    prefill_input=prefill, callback=on_step)

    def _generate_from_prompts(self, prompts, negative_prompt, guidance_scale, num_images_per_prompt, temperature,
                               top_k, top_p, generator, output_type, return_dict, callback, height, width):
        grid_h, grid_w = self.code_grid(height, width)
        repeat = lambda items: [x for x in items for _ in range(num_images_per_prompt)]  # noqa: E731
        rows = repeat(self.tokenize_prompt(prompts, height, width))
        generator = check_generators(generator, len(rows))
        logits = LogitsPipeline(temperature=temperature, top_k=top_k, top_p=top_p)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids, mask = _left_pad(rows, pad)
        adapter = self.target_adapter(grid_width=grid_w)
        target, prefill = adapter, None
        if guidance_scale != 1:
            if negative_prompt is None and self.model_kind == "janus":
                prefill = adapter.cfg_prefill_input(ids, mask)  # Janus's own unconditional prompt
            else:
                negatives = None
                if negative_prompt is not None:
                    negatives = _as_prompt_list(negative_prompt, "negative_prompt")
                    negatives = repeat(negatives * len(prompts) if len(negatives) == 1 else negatives)
                both, both_mask = _left_pad(rows + self._unconditional_rows(rows, negatives, height, width), pad)
                prefill = (adapter.prompt_ids(both), both_mask)
            target = CFGModel(adapter, guidance_scale)
        out = self._run_decoder(target, logits, adapter.prompt_ids(ids), mask, prefill, (grid_h, grid_w), generator,
                                callback)
        images = self.decode_tokens(out.sequences, (grid_h, grid_w))
        images = self.postprocess(images, output_type)
        if not return_dict:
            return images, out.stats
        return ARImagePipelineOutput(images=images, tokens=out.sequences, stats=out.stats)

    @torch.no_grad()
    def decode_tokens(self, codes: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Codes [N, rows*cols] -> float images [N, 3, H, W] in [0, 1], by the model's image decoder
        (Janus: `decode_image_tokens`; Emu3: its VQ model's `decode`; LlamaGen / Chameleon: `vqvae`).
        grid: (rows, cols), default the model's square grid."""
        rows, cols = grid if grid is not None else (self.grid_size, self.grid_size)
        codes = codes.reshape(-1, rows, cols).to(self.device)
        kind = self.model_kind
        if kind == "janus":
            pixels = self.transformer.decode_image_tokens(codes.flatten(1)).permute(0, 3, 1, 2)
        elif kind == "emu3":
            pixels = self.transformer.model.vqmodel.decode(codes)
        else:
            pixels = decode_codes(self.vqvae, codes)
        return ((pixels.float() + 1) / 2).clamp(0, 1)

    # --- bench protocol (see mmspec.common.bench) ------------------------
    bench_num_samples = 100

    def _require_class_conditional(self, what: str) -> None:
        if not self.is_class_conditional:
            raise NotImplementedError(f"{what} needs a class-conditional pipeline (class labels, bundled classifier); "
                                      f"this one drives {type(self.transformer).__name__}")

    def bench_inputs(self, num_samples: int, seed: int) -> list[int]:
        """Class labels, cycling through the classes."""
        self._require_class_conditional("bench_inputs")
        return [i % self.num_classes for i in range(num_samples)]

    def bench_generate(self, inputs: list, batch_size: int, seed: int, settings: dict):
        """Image i always uses generator seed+i, whatever the batching. Returns code lists + stats.

        inputs: class labels, or prompts for a text-to-image pipeline."""
        key = "class_labels" if self.is_class_conditional else "prompt"
        sequences, stats = [], DecodeStats()
        disabled = getattr(self, "_progress_bar_config", {}).get("disable")
        self.set_progress_bar_config(disable=True)
        try:
            for start in range(0, len(inputs), batch_size):
                chunk = inputs[start:start + batch_size]
                gens = [torch.Generator().manual_seed(seed + start + i) for i in range(len(chunk))]
                out = self(**{key: chunk}, generator=gens, output_type="pt", **settings)
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

        self._require_class_conditional("bench_quality")
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

    @classmethod
    def add_cli_arguments(cls, parser) -> None:
        parser.add_argument("--class-label", type=int, action="append", default=[],
                            help="class to generate (repeatable; default: --num images cycling through the classes)")

    def cli_generate(self, args, call: dict) -> int:
        """`mmspec generate PLUGIN --num N --out grid.png`: N images cycling through the classes."""
        from .data import CLASS_NAMES
        from .metrics import save_image_grid

        self._require_class_conditional("cli_generate")
        labels = args.class_label or self.bench_inputs(args.num, args.seed)
        self.check_inputs(labels, 1.0, 1, "pt")
        codes, stats = self.bench_generate(labels, args.batch_size, args.seed, call)
        codes = torch.tensor(codes, device=self.device).view(-1, self.grid_size, self.grid_size)
        images = ((decode_codes(self.vqvae, codes) + 1) / 2).cpu()
        out = args.out or "grid.png"
        save_image_grid(images, rows=-(-len(images) // self.num_classes), path=out)  # a column per class
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
    return ARImagePipeline(transformer, load_bundled_vq(device))
