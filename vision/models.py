"""The image models `ARImagePipeline` drives: one `ImageModel` per family holds that family's facts.

An `ImageModel` is built from the pipeline's components (transformer, vqvae, tokenizer) and answers what
the pipeline needs to know about them, so the pipeline has one code path for every family:

- `validate()`: the components fit together (which families need a `vqvae`, config consistency);
- `grid_size`, `code_grid(height, width)`, `vq_scale_factor`: the image sizes it generates, and
  `rows_in_parallel`: whether its adapter decodes several rows at once (the `CodeGrid` it offers);
- `num_codes`, `codebook()`: the image vocabulary and its latent vectors;
- `check_conditioning(...)`, `prompt_rows(...)`, `tokenize_prompt(...)`: what conditions an image (class
  labels, or text prompts formatted as the model's processor does, image-start tokens included), as rows of
  *prompt ids*, and `unconditional_rows(...)`: the family's own unconditional rows for classifier-free
  guidance; `prompt_ids(...)` maps prompt ids to the adapter's token ids;
- `adapter(grid)`: the `ARModel` the decoding plugins verify with; `decode(codes, grid)`: codes -> pixels.

Families (each class's docstring gives its prompt, unconditional row and image size):

- `LlamaGenImageModel`: the bundled class-conditional `LlamaGenModel` with a diffusers `VQModel`;
- `JanusImageModel`, `Emu3ImageModel`, `ChameleonImageModel`: transformers' text-to-image models.

`image_model_for(transformer, ...)` picks the family by the transformer's class (`IMAGE_MODELS`); a new
family is one new class under `@register_image_model`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from einops import rearrange

from mmspec.common.model import ARModel

from .hf_adapters import ChameleonImageAdapter, Emu3ImageAdapter, JanusImageAdapter
from .llamagen import LlamaGenAdapter, LlamaGenModel
from .tokenizer import codebook, decode_codes

# transformer class -> the ImageModel family that drives it (see `ImageModel.transformer_class`).
IMAGE_MODELS: dict[type | str, type["ImageModel"]] = {}


def register_image_model(cls: type["ImageModel"]) -> type["ImageModel"]:
    """Class decorator: `cls` drives transformers of class `cls.transformer_class` (and its subclasses that
    have no family of their own)."""
    IMAGE_MODELS[cls.transformer_class] = cls
    return cls


def _class_name(key: type | str) -> str:
    return key.__name__ if isinstance(key, type) else key.split(":")[1]


def _matches(klass: type, key: type | str) -> bool:
    if isinstance(key, type):
        return klass is key
    package, name = key.split(":")
    return klass.__name__ == name and (klass.__module__ == package or klass.__module__.startswith(package + "."))


def image_model_class(transformer) -> type["ImageModel"]:
    """The family of `transformer`: that of its class, else of its nearest registered base class."""
    for klass in type(transformer).__mro__:
        for key, family in IMAGE_MODELS.items():
            if _matches(klass, key):
                return family
    supported = ", ".join(_class_name(key) for key in IMAGE_MODELS)
    raise TypeError(f"transformer must be one of the supported image model classes: {supported}; "
                    f"got {type(transformer).__name__}")


def image_model_for(transformer, vqvae=None, tokenizer=None) -> "ImageModel":
    """The `ImageModel` of `transformer`'s family over these components (not validated: see `validate`)."""
    return image_model_class(transformer)(transformer, vqvae, tokenizer)


def vq_upsampling(vq) -> int:
    """Pixels per code of a diffusers VQModel (its decoder upsamples once per block but the last)."""
    return 2 ** (len(vq.config.block_out_channels) - 1)


def integer_labels(value) -> list[int] | None:
    """Class labels as a list of Python ints: an int, a numpy or torch integer (0-d or 1-d), or a sequence of
    them, as diffusers' class-conditional pipelines take them; None for anything else (bools included)."""
    import numpy as np

    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim > 1 or value.dtype in (torch.bool, np.bool_) or \
                (value.dtype.is_floating_point if isinstance(value, torch.Tensor) else value.dtype.kind != "i"):
            return None
        value = value.tolist()
    items = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_)) for c in items):
        return None
    return [int(c) for c in items]


def as_prompt_list(value, name: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{name} must be a string or a non-empty list of strings, got {value!r}")
    return list(texts)


def to_unit_range(pixels: torch.Tensor) -> torch.Tensor:
    """Decoder output in [-1, 1] -> float images in [0, 1]."""
    return ((pixels.float() + 1) / 2).clamp(0, 1)


class ImageModel:
    """One family's facts. The defaults are those of a family that decodes with the pipeline's `vqvae` (a
    diffusers `VQModel`) at one square size; families override what differs."""

    name: ClassVar[str] = ""  # the pipeline's `model_kind`
    # The transformer class this family drives: the class, or "package:Class" for a class defined in that
    # package (matched by name, so no module is imported to find out that a transformer is not one).
    transformer_class: ClassVar[type | str] = ""
    class_conditional: ClassVar[bool] = False
    needs_vqvae: ClassVar[bool] = True  # True: `vqvae` is required; False: it must be None (own VQ decoder)
    why_vqvae: ClassVar[str] = ""  # completes "vqvae is required: ..."
    rows_in_parallel: ClassVar[bool] = True  # several rows decode at once: codes may come out of raster order

    def __init__(self, transformer, vqvae=None, tokenizer=None):
        self.transformer = transformer
        self.vqvae = vqvae
        self.tokenizer = tokenizer

    @property
    def transformer_name(self) -> str:
        return type(self.transformer).__name__

    def validate(self) -> None:
        """Raise a clear ValueError if the components do not fit together."""
        if self.needs_vqvae and self.vqvae is None:
            raise ValueError(f"vqvae is required: {self.why_vqvae}")
        if not self.needs_vqvae and self.vqvae is not None:
            raise ValueError(f"vqvae must be None for {self.transformer_name}: it decodes with its own VQ model")

    # --- image size ---------------------------------------------------------------------------
    @property
    def grid_size(self) -> int:
        """Codes per image side (at the default size, for families that take several)."""
        raise NotImplementedError

    @property
    def vq_scale_factor(self) -> int:
        """Pixels per code along each side."""
        return vq_upsampling(self.vqvae)

    def code_grid(self, height: int | None = None, width: int | None = None) -> tuple[int, int]:
        """(rows, cols) of codes for an image of height x width pixels (None: the default size)."""
        side = self.grid_size * self.vq_scale_factor
        if height not in (None, side) or width not in (None, side):
            raise ValueError(f"{self.transformer_name} generates {side}x{side} images only: height and width must "
                             f"be None or {side}, got {height!r} x {width!r}")
        return self.grid_size, self.grid_size

    # --- image vocabulary ---------------------------------------------------------------------
    @property
    def num_codes(self) -> int:
        """Codebook size: the adapter's vocabulary (codes 0..num_codes-1)."""
        raise NotImplementedError

    def codebook(self) -> torch.Tensor:
        """[num_codes, D] the latent vector of every image code (methods that compare codes by latent)."""
        return codebook(self.vqvae)

    # --- conditioning -------------------------------------------------------------------------
    @property
    def num_classes(self) -> int | None:
        """Number of classes of a class-conditional model (None for text-to-image models)."""
        return None

    def require_prompts(self) -> None:
        """Raise a clear ValueError unless these components take text prompts."""
        raise ValueError("prompt needs a text-to-image model and a tokenizer: this pipeline's transformer is a "
                         f"class-conditional {self.transformer_name} (use class_labels)")

    def check_conditioning(self, class_labels, prompt, negative_prompt) -> list:
        """Validate what conditions this call; returns the inputs (class labels or prompts), one per image
        before `num_images_per_prompt`."""
        raise NotImplementedError

    def tokenize_prompt(self, prompt, grid: tuple[int, int]) -> list[list[int]]:
        """Language-model ids of each prompt, formatted as the model's processor does for an image of
        `grid` codes (families without text prompts raise, see `require_prompts`)."""
        self.require_prompts()
        raise NotImplementedError(f"{type(self).__name__} takes prompts but does not tokenize them")

    def prompt_rows(self, inputs: list, grid: tuple[int, int]) -> list[list[int]]:
        """The conditional prompt of each input, in prompt ids (see `prompt_ids`)."""
        raise NotImplementedError

    def unconditional_rows(self, rows: list[list[int]], grid: tuple[int, int]) -> list[list[int]]:
        """The family's own unconditional prompt (prompt ids) for each conditional row, for guidance without
        a negative prompt."""
        raise NotImplementedError

    @property
    def pad_token_id(self) -> int:
        """Prompt id that left-pads rows of different lengths (masked out)."""
        return 0

    def prompt_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Prompt ids [B, T] -> the adapter's token ids (prompt tokens come after the codes)."""
        return ids + self.num_codes

    # --- decoding -----------------------------------------------------------------------------
    # Whether `adapter(grid, compile=...)` can run the step forward compiled at static shapes
    # (`mmspec.common.compiled`): the adapter must keep its KV cache in a StaticKV.
    compiles: ClassVar[bool] = False

    def adapter(self, grid: tuple[int, int], compile=None) -> ARModel:
        """The ARModel the decoding plugins verify with for images of `grid` codes; its vocabulary is the
        codebook. compile: CompileSettings for families with `compiles` (None: eager)."""
        raise NotImplementedError

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """codes [N, rows*cols] (row-major) -> float images [N, 3, H, W] in [0, 1]."""
        rows, cols = grid
        codes = rearrange(codes, "n (h w) -> n h w", h=rows, w=cols)
        return to_unit_range(decode_codes(self.vqvae, codes))


@register_image_model
class LlamaGenImageModel(ImageModel):
    """The class-conditional `LlamaGenModel` (the bundled model; LlamaGen C2I checkpoints).

    Conditioning: class labels, each a one-token prompt (prompt id = the label, adapter id = its class
    token). Unconditional row (CFG): the null class, as LlamaGen trains it. Image size: the model's square
    grid (`block_size` codes); `vqvae`, the diffusers `VQModel` whose codes it predicts, decodes them.
    """

    name = "llamagen"
    transformer_class = LlamaGenModel
    class_conditional = True
    why_vqvae = "the class-conditional LlamaGenModel predicts a VQModel's codes"

    @property
    def grid_size(self) -> int:
        return self.transformer.grid_size

    @property
    def num_codes(self) -> int:
        return self.transformer.config.vocab_size

    @property
    def num_classes(self) -> int:
        return self.transformer.config.num_classes

    def check_conditioning(self, class_labels, prompt, negative_prompt) -> list[int]:
        if prompt is not None or negative_prompt is not None:
            self.require_prompts()
        last = self.num_classes - 1
        if class_labels is None:
            raise ValueError(f"class_labels is required: an int or a list of ints in [0, {last}]")
        labels = integer_labels(class_labels)
        if not labels:
            raise ValueError(f"class_labels must be an int or a non-empty list of ints (numpy and torch integers "
                             f"too), got {class_labels!r}")
        bad = [c for c in labels if not 0 <= c < self.num_classes]
        if bad:
            raise ValueError(f"class_labels {bad} out of range: allowed 0..{last}")
        return labels

    def prompt_rows(self, inputs: list[int], grid) -> list[list[int]]:
        return [[label] for label in inputs]

    def unconditional_rows(self, rows, grid) -> list[list[int]]:
        return [[self.transformer.null_class] for _ in rows]

    def prompt_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self.transformer.class_token(ids)

    compiles = True

    def adapter(self, grid, compile=None) -> ARModel:
        return LlamaGenAdapter(self.transformer, compile=compile)


class TextToImageModel(ImageModel):
    """A transformers multimodal model generating images after a text prompt: BOS + text + the family's
    image-start suffix (`image_start`), with the tokenizer's own special tokens not added (BOS once, here).
    The image-start tokens come from the tokenizer's attributes (`boi_token`, ...) or the processors'
    defaults. Prompt ids are language-model ids; the adapters put them after the codes (`hf_adapters`)."""

    boi_token: ClassVar[str] = ""  # the processor's image-start token, when the tokenizer names none

    def require_prompts(self) -> None:
        if self.tokenizer is None:
            raise ValueError("prompt needs a text-to-image model and a tokenizer: this pipeline has no tokenizer")

    def check_conditioning(self, class_labels, prompt, negative_prompt) -> list[str]:
        if class_labels is not None:
            raise ValueError(f"class_labels is only for class-conditional models (LlamaGenModel); this pipeline's "
                             f"{self.transformer_name} takes prompt=")
        if prompt is not None or negative_prompt is not None:
            self.require_prompts()
        if prompt is None:
            raise ValueError("prompt is required: a string or a list of strings")
        return as_prompt_list(prompt, "prompt")

    # --- special tokens -----------------------------------------------------------------------
    def special_id(self, attribute: str, default: str) -> int:
        """Id of the tokenizer's `attribute` token (e.g. boi_token), else of the processor's `default`."""
        token = getattr(self.tokenizer, attribute, None) or default
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or (token_id == self.tokenizer.unk_token_id and token != self.tokenizer.unk_token):
            raise ValueError(f"the tokenizer has no {token!r} token, which {self.transformer_name} prompts need")
        return int(token_id)

    @property
    def bos_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        if bos is None:
            bos = getattr(self.transformer.generation_config, "bos_token_id", None)
        if bos is None:
            raise ValueError("neither the tokenizer nor the model's generation config has a BOS token")
        return int(bos)

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def text_ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    # --- prompts ------------------------------------------------------------------------------
    def image_start(self, grid: tuple[int, int]) -> list[int]:
        """LM ids that end every prompt and start the image (its first code follows)."""
        return [self.special_id("boi_token", self.boi_token)]

    def image_token_ids(self) -> set[int]:
        """LM ids of the image codes, which a text prompt must not contain (none where codes are not text)."""
        return set()

    def tokenize_prompt(self, prompt, grid) -> list[list[int]]:
        self.require_prompts()
        texts = as_prompt_list(prompt, "prompt")
        bos, suffix = self.bos_token_id, self.image_start(grid)
        rows = [[bos] + self.text_ids(t) + suffix for t in texts]
        self.check_text_ids(rows)
        return rows

    def check_text_ids(self, rows: list[list[int]]) -> None:
        flat = torch.tensor([i for r in rows for i in r], dtype=torch.long)
        vocab = self.transformer.get_input_embeddings().num_embeddings
        outside = (flat < 0) | (flat >= vocab)
        if bool(outside.any()):
            raise ValueError(f"the tokenizer produced ids outside the model's text vocabulary (0..{vocab - 1}): "
                             f"{sorted(set(flat[outside].tolist()))}")
        image = self.image_token_ids() & set(flat.tolist())
        if image:
            raise ValueError(f"the tokenized prompt contains image-token ids {sorted(image)}")

    def prompt_rows(self, inputs: list[str], grid) -> list[list[int]]:
        return self.tokenize_prompt(inputs, grid)


@register_image_model
class JanusImageModel(TextToImageModel):
    """Janus / Janus-Pro (`JanusForConditionalGeneration`), which decodes with its own VQ model.

    Prompt: BOS text <begin_of_image> (JanusProcessor in image mode). Unconditional row (CFG): Janus's own,
    as its `generate(generation_mode="image")` builds it: every token but BOS and <begin_of_image> replaced
    by the pad token (`JanusImageAdapter.unconditional_ids`). Image size: vq_config.num_patches² codes
    (= vision_config.num_image_tokens), vq_config.num_patches * 2^(levels - 1) pixels per side.
    """

    name = "janus"
    transformer_class = "transformers:JanusForConditionalGeneration"
    needs_vqvae = False
    boi_token = "<begin_of_image>"

    def validate(self) -> None:
        super().validate()
        config = self.transformer.config
        if config.vision_config.num_image_tokens != config.vq_config.num_patches ** 2:
            raise ValueError(f"inconsistent Janus config: vision_config.num_image_tokens = "
                             f"{config.vision_config.num_image_tokens} but the VQ decoder takes "
                             f"vq_config.num_patches² = {config.vq_config.num_patches ** 2} codes")

    @property
    def grid_size(self) -> int:
        return self.transformer.config.vq_config.num_patches

    @property
    def vq_scale_factor(self) -> int:
        return 2 ** (len(self.transformer.config.vq_config.channel_multiplier) - 1)

    @property
    def num_codes(self) -> int:
        return self.transformer.config.vq_config.num_embeddings

    def codebook(self) -> torch.Tensor:
        return self.transformer.model.vqmodel.quantize.embedding.weight.detach()

    @property
    def boi_token_id(self) -> int | None:
        """Janus's generate recognises <begin_of_image> by its generation config's id; the tokenizer's otherwise."""
        gen_kwargs = getattr(self.transformer.generation_config, "generation_kwargs", None) or {}
        boi = gen_kwargs.get("boi_token_id")
        if boi is None and self.tokenizer is not None:
            boi = self.special_id("boi_token", self.boi_token)
        return None if boi is None else int(boi)

    def image_start(self, grid) -> list[int]:
        return [self.boi_token_id]

    def unconditional_rows(self, rows, grid) -> list[list[int]]:
        adapter = self.adapter(grid)
        return [adapter.unconditional_ids(torch.tensor(row)).tolist() for row in rows]

    def adapter(self, grid, compile=None) -> ARModel:
        return JanusImageAdapter(self.transformer, boi_token_id=self.boi_token_id)

    @torch.no_grad()
    def decode(self, codes, grid) -> torch.Tensor:
        pixels = self.transformer.decode_image_tokens(codes)  # [N, H, W, 3]
        return to_unit_range(rearrange(pixels, "n h w c -> n c h w"))


class _InVocabImageModel(TextToImageModel):
    """Emu3 / Chameleon: image codes are tokens of the language model's own vocabulary."""

    @property
    def num_codes(self) -> int:
        return len(self.transformer.model.vocabulary_mapping.img2bpe)

    def image_token_ids(self) -> set[int]:
        return set(self.transformer.model.vocabulary_mapping.image_tokens)


@register_image_model
class Emu3ImageModel(_InVocabImageModel):
    """Emu3 (`Emu3ForConditionalGeneration`), which decodes with its own VQ model, at any size.

    Prompt: BOS text <|image start|>H*W<|image token|> (Emu3Processor; H, W in codes). Unconditional row
    (CFG): the prompt's last token alone, as its `generate(guidance_scale=s)` without a negative prompt.
    Image size: height x width pixels, multiples of the VQ factor (codes = pixels / factor); default
    90x90 codes (Emu3Processor's default: ratio 1:1, image area 720², 8 px per code).
    """

    name = "emu3"
    transformer_class = "transformers:Emu3ForConditionalGeneration"
    needs_vqvae = False
    boi_token = "<|image start|>"
    image_wrapper_token = "<|image token|>"
    default_grid = 90
    rows_in_parallel = False  # the adapter feeds each row's end-of-line token after the row's last code

    @property
    def grid_size(self) -> int:
        return self.default_grid

    @property
    def vq_scale_factor(self) -> int:
        return int(self.transformer.model.vqmodel.spatial_scale_factor)

    def code_grid(self, height=None, width=None) -> tuple[int, int]:
        factor, sizes = self.vq_scale_factor, []
        for name, value in (("height", height), ("width", width)):
            if value is None:
                value = self.default_grid * factor
            if not isinstance(value, int) or isinstance(value, bool) or value < factor or value % factor:
                raise ValueError(f"{name} must be a positive multiple of {factor} pixels (one code), got {value!r}")
            sizes.append(value // factor)
        return sizes[0], sizes[1]

    def codebook(self) -> torch.Tensor:
        return self.transformer.model.vqmodel.quantize.embedding.weight.detach()

    def image_start(self, grid) -> list[int]:
        rows, cols = grid
        return ([self.special_id("boi_token", self.boi_token)] + self.text_ids(f"{rows}*{cols}")
                + [self.special_id("image_wrapper_token", self.image_wrapper_token)])

    def unconditional_rows(self, rows, grid) -> list[list[int]]:
        return [row[-1:] for row in rows]

    def adapter(self, grid, compile=None) -> ARModel:
        return Emu3ImageAdapter(self.transformer, width=grid[1])

    @torch.no_grad()
    def decode(self, codes, grid) -> torch.Tensor:
        rows, cols = grid
        codes = rearrange(codes, "n (h w) -> n h w", h=rows, w=cols)
        return to_unit_range(self.transformer.model.vqmodel.decode(codes))


@register_image_model
class ChameleonImageModel(_InVocabImageModel):
    """Chameleon / Anole / Lumina-mGPT (`ChameleonForConditionalGeneration`); transformers ships its VQ encoder
    only, so `vqvae` is a diffusers `VQModel` with its codebook (e.g. its VQGAN decoder converted).

    Prompt: BOS text <racm3:break> (Meta's image decoder). Unconditional row (CFG): the formatted empty
    prompt [BOS, <racm3:break>] (Meta's chameleon image CFG). Image size: (vq resolution / VQ factor)² codes.
    """

    name = "chameleon"
    transformer_class = "transformers:ChameleonForConditionalGeneration"
    why_vqvae = "transformers' Chameleon has no VQ decoder; pass a diffusers VQModel with its codebook"
    boi_token = "<racm3:break>"

    def validate(self) -> None:
        super().validate()
        codes = len(self.transformer.model.vocabulary_mapping.image_tokens)
        if self.vqvae.config.num_vq_embeddings != codes:
            raise ValueError(f"vqvae has {self.vqvae.config.num_vq_embeddings} codes, the model's image vocabulary "
                             f"has {codes}")

    @property
    def grid_size(self) -> int:
        vq = self.transformer.config.vq_config
        return vq.resolution // 2 ** (len(vq.channel_multiplier) - 1)

    def unconditional_rows(self, rows, grid) -> list[list[int]]:
        return self.tokenize_prompt([""] * len(rows), grid)

    def adapter(self, grid, compile=None) -> ARModel:
        return ChameleonImageAdapter(self.transformer)
