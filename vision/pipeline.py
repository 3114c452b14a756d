"""ARImagePipeline: class-conditional or text-to-image generation by any decoding plugin, diffusers-style.

The pipeline's `transformer` is either

- our class-conditional `LlamaGenModel` (with a diffusers `VQModel` as `vqvae`): `pipe(class_labels=...)`;
- a transformers image-generating multimodal model with a `tokenizer`: `pipe(prompt=...)`.
  `JanusForConditionalGeneration` and `Emu3ForConditionalGeneration` decode with their own VQ models;
  `ChameleonForConditionalGeneration` needs `vqvae` (transformers ships Chameleon's VQ encoder only).

What differs between these families (image sizes, codebook, prompt format and image-start tokens, the
unconditional rows of classifier-free guidance, decoding codes to pixels) lives on one `ImageModel` per
family (`mmspec.vision.models`, whose class docstrings give each family's prompt choices), picked by the
transformer's class; the pipeline runs one code path over it. With `negative_prompt`, the unconditional
rows are the negative prompts formatted like the prompts (Emu3's reference pipeline does this for its
negative prompt; for Janus and Chameleon it is an extension).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import PIL.Image
import torch
from diffusers import DiffusionPipeline, VQModel
from diffusers.utils import BaseOutput
from einops import rearrange

from mmspec.common.logits import LogitsPipeline, check_generators
from mmspec.common.model import ARModel, CFGModel
from mmspec.common.loading import load_saved_plugin
from mmspec.common.pipeline import Pipeline, SampleStream, TokenProgress
from mmspec.common.plugin import DecodeRequest
from mmspec.common.stats import DecodeStats
from mmspec.common.structure import CodeGrid

from .llamagen import LlamaGenModel
from .models import ImageModel, as_prompt_list, image_model_for
from .spec import IMAGE_SPEC

OUTPUT_TYPES = ("pil", "np", "pt")
DIFFUSERS_SHIM = "pipeline"  # the module file a saved folder carries for DiffusionPipeline.from_pretrained
DIFFUSERS_SHIM_SOURCE = ('"""Written by mmspec: lets diffusers\' DiffusionPipeline.from_pretrained load this folder."""\n'
                         "from mmspec.vision.pipeline import ARImagePipeline  # noqa: F401\n")


@dataclass
class ARImagePipelineOutput(BaseOutput):
    images: list | np.ndarray | torch.Tensor  # PIL list, [N, H, W, 3] float in [0, 1], or [N, 3, H, W]
    tokens: torch.Tensor  # [N, rows*cols] long; the generated codes (codebook indices, row-major)
    stats: DecodeStats


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return ids, mask


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
    spec = IMAGE_SPEC
    call_defaults = IMAGE_SPEC.call_defaults

    def __init__(self, transformer, vqvae: VQModel | None = None, tokenizer=None):
        super().__init__()
        image_model_for(transformer, vqvae, tokenizer).validate()
        self.register_modules(transformer=transformer, vqvae=vqvae, tokenizer=tokenizer)
        self.plugin = None

    # --- persistence: diffusers' folders, plus the attached plugin ---------
    def save_pretrained(self, save_directory, **kwargs):
        """A diffusers folder that `ARImagePipeline.from_pretrained`, `mmspec.load_plugin(model=folder)` and
        diffusers' own `DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)` all load, plugin
        included: model_index.json names the class as diffusers names a custom pipeline, [file, class], and the
        file is a one-line import of this class."""
        super().save_pretrained(save_directory, **kwargs)
        (Path(save_directory) / f"{DIFFUSERS_SHIM}.py").write_text(DIFFUSERS_SHIM_SOURCE)
        index = Path(save_directory) / "model_index.json"
        config = json.loads(index.read_text())
        config["_class_name"] = [DIFFUSERS_SHIM, type(self).__name__]
        index.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        self.save_plugin(save_directory)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        shim = Path(pretrained_model_name_or_path) / f"{DIFFUSERS_SHIM}.py"
        if shim.is_file() and shim.read_text() == DIFFUSERS_SHIM_SOURCE:
            # the folder's code is exactly our own import line: nothing foreign runs, so no opt-in is asked
            kwargs.setdefault("trust_remote_code", True)
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)

    def register_to_config(self, **kwargs):
        # diffusers' from_pretrained (ours and DiffusionPipeline's alike) ends by recording the folder here:
        # the one hook both loaders share, so a saved plugin comes back whichever loader the user called.
        super().register_to_config(**kwargs)
        folder = kwargs.get("_name_or_path")
        if folder is not None and os.path.isdir(folder):
            self.plugin = load_saved_plugin(folder)

    @classmethod
    def from_saved(cls, directory, device: str = "cpu") -> "ARImagePipeline":
        return cls.from_pretrained(directory).to(device)

    @property
    def token_structure(self) -> CodeGrid:
        """The code grid of an image at the model's default size, with the codebook's latents."""
        return self.code_structure(self.code_grid())

    def code_structure(self, grid: tuple[int, int]) -> CodeGrid:
        """The token structure of an image of grid = (rows, cols) codes."""
        model = self.image_model
        return CodeGrid(grid[0], grid[1], latents=model.codebook(), rows_in_parallel=model.rows_in_parallel)

    # --- compiled forwards --------------------------------------------------
    compile_settings = None  # CompileSettings while `enable_compile` is on (None: eager)

    def enable_compile(self, compile=True) -> "ARImagePipeline":
        """Run the target's step forwards through `torch.compile` at static shapes from the next call on
        (`mmspec.common.compiled`; compile=False turns it off). Greedy outputs equal eager ones on the bundled
        model (tests); the first calls at each batch / draft-width bucket pay the compilation."""
        from mmspec.common.compiled import as_compile_settings

        settings = as_compile_settings(compile)
        if settings is not None and not self.image_model.compiles:
            raise ValueError(f"compile: the {self.image_model.name!r} family's adapter has no static KV cache; "
                             "compile=True works with LlamaGen-style transformers (use compile=False)")
        self.compile_settings = settings
        return self

    # --- what the transformer is: its family's ImageModel ------------------
    @property
    def image_model(self) -> ImageModel:
        """The facts of the transformer's family over the current components (`mmspec.vision.models`)."""
        return image_model_for(self.transformer, self.vqvae, self.tokenizer)

    @property
    def model_kind(self) -> str:
        """"llamagen", "janus", "emu3" or "chameleon" (the family's `ImageModel.name`)."""
        return self.image_model.name

    @property
    def is_class_conditional(self) -> bool:
        return self.image_model.class_conditional

    @property
    def num_classes(self) -> int | None:
        """Number of classes of a class-conditional model (None for text-to-image models)."""
        return self.image_model.num_classes

    @property
    def grid_size(self) -> int:
        """Codes per image side (Emu3: the default; its size is chosen per call)."""
        return self.image_model.grid_size

    @property
    def vq_scale_factor(self) -> int:
        """Pixels per code along each side."""
        return self.image_model.vq_scale_factor

    def code_grid(self, height: int | None = None, width: int | None = None) -> tuple[int, int]:
        """(rows, cols) of codes for an image of height x width pixels (None: the model's size).

        Emu3 generates any size (multiples of `vq_scale_factor` pixels; default 90x90 codes, Emu3Processor's
        default); the other models have one size.
        """
        return self.image_model.code_grid(height, width)

    def codebook(self) -> torch.Tensor:
        """[N, D] the VQ codebook: the latent vector of every image code (methods that compare codes by latent)."""
        return self.image_model.codebook()

    def target_adapter(self, grid_width: int | None = None) -> ARModel:
        """The ARModel the decoding plugins verify with; its vocabulary is the image codebook.

        grid_width: codes per image row (Emu3 only, which writes an end-of-line token after each row;
        default: `grid_size`).
        """
        side = self.grid_size
        return self.image_model.adapter((side, side if grid_width is None else grid_width))

    # --- prompts -----------------------------------------------------------
    def tokenize_prompt(self, prompt, height: int | None = None, width: int | None = None) -> list[list[int]]:
        """Language-model ids of each prompt, as the model's processor builds image-generation prompts:
        BOS + text + the image-start suffix (see `mmspec.vision.models`). height/width matter for Emu3 only.

        The tokenizer's own special tokens are not added (BOS is added here, once); the image-start tokens
        come from the tokenizer's `boi_token` (and Emu3's `image_wrapper_token`) or the processors' defaults.
        """
        model = self.image_model
        model.require_prompts()
        return model.tokenize_prompt(prompt, model.code_grid(height, width))

    # --- inputs ------------------------------------------------------------
    def check_inputs(self, class_labels, guidance_scale, num_images_per_prompt, output_type, prompt=None,
                     negative_prompt=None, height=None, width=None):
        """Validate a call; returns the class labels (class-conditional) or the prompts (text-to-image)."""
        if class_labels is not None and prompt is not None:
            raise ValueError("pass exactly one of class_labels and prompt, not both (class_labels for "
                             "class-conditional models, prompt for text-to-image models)")
        model = self.image_model
        inputs = model.check_conditioning(class_labels, prompt, negative_prompt)
        if not isinstance(guidance_scale, (int, float)) or not guidance_scale >= 1:
            raise ValueError(f"guidance_scale must be >= 1 (1 disables classifier-free guidance), "
                             f"got {guidance_scale!r}")
        if negative_prompt is not None:
            negatives = as_prompt_list(negative_prompt, "negative_prompt")
            if len(negatives) not in (1, len(inputs)):
                raise ValueError(f"negative_prompt must be one string or one per prompt ({len(inputs)}), "
                                 f"got {len(negatives)}")
            if guidance_scale == 1:
                raise ValueError("negative_prompt needs classifier-free guidance (guidance_scale > 1)")
        if not isinstance(num_images_per_prompt, int) or num_images_per_prompt < 1:
            raise ValueError(f"num_images_per_prompt must be an int >= 1, got {num_images_per_prompt!r}")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}")
        model.code_grid(height, width)
        return inputs

    @torch.no_grad()
    def __call__(self, class_labels=None, guidance_scale: float = 3.0, num_images_per_prompt: int = 1,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, generator=None,
                 output_type: str = "pil", return_dict: bool = True, callback_on_step_end=None, *,
                 prompt=None, negative_prompt=None, height: int | None = None, width: int | None = None,
                 max_batch_size: int | None = None, callback_on_step_end_tensor_inputs: list[str] | None = None,
                 on_sample_done=None):
        """Generate images for `class_labels` (class-conditional transformer) or `prompt` (text-to-image).

        guidance_scale: classifier-free guidance u + s·(c − u) (1: none). negative_prompt (text-to-image, with
        guidance): one string or one per prompt, the unconditional prompts; default: the model's own
        unconditional prompt (`mmspec.vision.models`). num_images_per_prompt: images per label / prompt,
        consecutive. generator: one, or one per image (then image i's randomness depends on generator i only).
        callback_on_step_end(pipe, step, timestep=None, callback_kwargs) runs after every decode step;
        callback_on_step_end_tensor_inputs names what callback_kwargs holds (diffusers' convention; of
        `_callback_tensor_inputs`, default all: "tokens", the tokens committed that step).
        height, width: pixels; only Emu3 takes other sizes than its fixed one. max_batch_size: decode at most
        this many images at once, starting the next waiting image as soon as one finishes (continuous
        batching, where the plugin's decoder supports it; otherwise batches in turn); None: all at once.
        on_sample_done(index, image, statistics): called as each image is ready, before the call returns (with
        continuous batching, as soon as its codes are done; `mmspec batch` writes it then); image as
        `output_type` makes it, statistics its own target forwards and committed tokens (`SampleStream`).
        """
        tensor_inputs = list(self._callback_tensor_inputs if callback_on_step_end_tensor_inputs is None
                             else callback_on_step_end_tensor_inputs)
        unknown = [k for k in tensor_inputs if k not in self._callback_tensor_inputs]
        if unknown:
            raise ValueError(f"callback_on_step_end_tensor_inputs {unknown} are not available; allowed: "
                             f"{self._callback_tensor_inputs}")
        inputs = self.check_inputs(class_labels, guidance_scale, num_images_per_prompt, output_type,
                                   prompt=prompt, negative_prompt=negative_prompt, height=height, width=width)
        model = self.image_model
        grid = model.code_grid(height, width)
        repeat = lambda items: [x for x in items for _ in range(num_images_per_prompt)]  # noqa: E731
        rows = repeat(model.prompt_rows(inputs, grid))
        generator = check_generators(generator, len(rows))
        logits = LogitsPipeline(temperature=temperature, top_k=top_k, top_p=top_p)
        ids, mask = _left_pad(rows, model.pad_token_id)
        adapter = model.adapter(grid, compile=self.compile_settings)
        target, prefill = adapter, None
        if guidance_scale != 1:
            if negative_prompt is None:
                uncond = model.unconditional_rows(rows, grid)
            else:
                negatives = as_prompt_list(negative_prompt, "negative_prompt")
                negatives = negatives * len(inputs) if len(negatives) == 1 else negatives
                uncond = repeat(model.tokenize_prompt(negatives, grid))
            both, both_mask = _left_pad(rows + uncond, model.pad_token_id)  # [cond; uncond] rows for CFGModel
            target, prefill = CFGModel(adapter, guidance_scale), (model.prompt_ids(both), both_mask)
        stream = None
        if on_sample_done is not None:  # each image decoded once, as its codes finish
            stream = SampleStream(on_sample_done, lambda i, codes: self.postprocess(
                self.decode_tokens(torch.tensor(codes, device=self.device), grid), output_type)[0], len(rows))
        out = self._run_decoder(target, logits, model.prompt_ids(ids), mask, prefill, grid, generator,
                                callback_on_step_end, max_batch_size, tensor_inputs, stream)
        if stream is None:
            images = self.postprocess(self.decode_tokens(out.sequences, grid), output_type)
        else:
            stream.close(out.tolist(), out.stats)
            images = stream.outputs if output_type == "pil" else (
                np.stack(stream.outputs) if output_type == "np" else torch.stack(stream.outputs))
        if not return_dict:
            return images, out.stats
        return ARImagePipelineOutput(images=images, tokens=out.sequences, stats=out.stats)

    def _run_decoder(self, target, logits, input_ids, attention_mask, prefill, grid, generator, callback,
                     max_batch_size=None, tensor_inputs=("tokens",), stream: SampleStream | None = None):
        request = DecodeRequest(target, logits, self.code_structure(grid))
        total = grid[0] * grid[1]
        with self.progress_bar(total=total * input_ids.shape[0]) as bar:
            progress = TokenProgress(bar)

            def on_step(step, info):
                progress.add(info["num_accepted"])
                if callback is not None:
                    callback(self, step, None, {k: info[k] for k in tensor_inputs})

            step_callback = on_step if stream is None else stream.step_callback(then=on_step)
            out = self.run_decoder(request, input_ids, attention_mask, max_new_tokens=total, generator=generator,
                                   prefill_input=prefill, callback=step_callback, max_batch_size=max_batch_size)
            progress.close()
            return out

    @torch.no_grad()
    def decode_tokens(self, codes: torch.Tensor, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Codes [N, rows*cols] -> float images [N, 3, H, W] in [0, 1], by the model's image decoder
        (Janus: `decode_image_tokens`; Emu3: its VQ model's `decode`; LlamaGen / Chameleon: `vqvae`).
        grid: (rows, cols), default the model's square grid."""
        rows, cols = grid if grid is not None else (self.grid_size, self.grid_size)
        if codes.dim() != 2 or codes.shape[1] != rows * cols:
            raise ValueError(f"codes must be [N, rows*cols] = [N, {rows * cols}] for a {rows}x{cols} grid, "
                             f"got {tuple(codes.shape)}")
        # One image at a time: convolution kernels round differently for other batch sizes, and an image
        # must not change in its last bits (nor its PNG bytes) with the batch it was decoded in.
        codes = codes.to(self.device)
        if codes.shape[0] < 2:
            return self.image_model.decode(codes, (rows, cols))
        return torch.cat([self.image_model.decode(codes[i:i + 1], (rows, cols)) for i in range(codes.shape[0])])

    # --- bench protocol (see mmspec.common.bench) ------------------------
    bench_num_samples = 100

    def bench_inputs(self, num_samples: int, seed: int) -> list:
        """Class labels cycling through the classes, or for a text-to-image model the built-in captions
        (`mmspec.vision.prompts.BENCH_PROMPTS`), cycling."""
        if self.is_class_conditional:
            return [i % self.num_classes for i in range(num_samples)]
        from .prompts import BENCH_PROMPTS

        self.image_model.require_prompts()
        return [BENCH_PROMPTS[i % len(BENCH_PROMPTS)] for i in range(num_samples)]

    def bench_generate(self, inputs: list, batch_size: int, seed: int, settings: dict):
        """Image i always uses generator seed+i, whatever the batching. Returns code lists + stats.

        inputs: class labels, or prompts for a text-to-image pipeline."""
        sequences, stats = [], DecodeStats()
        with self._progress_bar_off():
            for start in range(0, len(inputs), batch_size):
                chunk = inputs[start:start + batch_size]
                gens = [torch.Generator().manual_seed(seed + start + i) for i in range(len(chunk))]
                out = self(**{self._input_key: chunk}, generator=gens, output_type="pt", **settings)
                sequences += out.tokens.tolist()
                stats = stats.merge(out.stats)
        return sequences, stats

    @property
    def _input_key(self) -> str:
        return "class_labels" if self.is_class_conditional else "prompt"

    @contextmanager
    def _progress_bar_off(self):
        """The harness (bench, batch runner) shows its own progress; the per-call bar is off meanwhile."""
        disabled = getattr(self, "_progress_bar_config", {}).get("disable")
        self.set_progress_bar_config(disable=True)
        try:
            yield
        finally:
            self.set_progress_bar_config(disable=disabled)

    @torch.no_grad()
    def bench_quality(self, inputs: list, sequences: list[list[int]]) -> dict:
        """Class-conditional: class accuracy and Fréchet distance (bundled classifier) and the target's NLL of
        the codes. Text-to-image: the target's NLL only (no judge of text-image agreement ships offline).

        fd_floor is the distance between two disjoint sets of real held-out crops of the same size,
        the value a perfect generator would get at this sample count.
        """
        from mmspec.common.stats import PER_SAMPLE

        from . import metrics

        codes_per_image = [len(s) for s in sequences]
        if not self.is_class_conditional:
            nll = self.code_nll_per_sample(inputs, sequences).tolist()
            return {"nll": sum(nll) / max(1, sum(codes_per_image)), PER_SAMPLE: {"nll": (nll, codes_per_image)}}
        labels = torch.tensor(inputs)
        codes = torch.tensor(sequences, device=self.device)
        images = torch.cat([self.decode_tokens(c) for c in codes.split(100)]).cpu()
        classifier = metrics.load_bundled_classifier(self.device)
        real_a, real_b = _real_reference_features(classifier, len(images))
        fake = metrics.features(classifier, images)
        hits = metrics.class_hits(classifier, images, labels).double().tolist()
        nll = metrics.target_nll_per_image(self.transformer, labels.to(self.device), codes).tolist()
        # FD is a set statistic (no per-image part): its noise level is fd_floor, real against real.
        return {"class_acc": sum(hits) / len(hits),
                "fd": metrics.frechet_distance(fake, real_a),
                "fd_floor": metrics.frechet_distance(real_b, real_a),
                "nll": sum(nll) / max(1, codes.numel()),
                PER_SAMPLE: {"class_acc": (hits, [1.0] * len(hits)), "nll": (nll, codes_per_image)}}

    @torch.no_grad()
    def code_nll_per_sample(self, inputs: list, sequences: list[list[int]], batch_size: int = 32) -> torch.Tensor:
        """Summed NLL (nats) of each sample's codes under the conditional target (no guidance), given its
        input's prompt: any family, through its adapter. [N] float64 on the CPU."""
        model = self.image_model
        grid = model.code_grid(None, None)
        adapter = model.adapter(grid)
        sums = [torch.zeros(0, dtype=torch.float64)]
        for start in range(0, len(inputs), batch_size):
            ids, mask = _left_pad(model.prompt_rows(inputs[start:start + batch_size], grid), model.pad_token_id)
            codes = torch.tensor(sequences[start:start + batch_size], device=self.device)
            full = torch.cat([model.prompt_ids(ids).to(self.device), codes], 1)
            full_mask = torch.cat([mask.to(self.device), torch.ones_like(codes)], 1)
            _, out = adapter.prefill(full, full_mask)
            logp = out.logits[:, ids.shape[1] - 1:-1].float().log_softmax(-1)
            sums.append(-logp.gather(2, codes[..., None])[..., 0].sum(1).double().cpu())
        return torch.cat(sums)

    @torch.no_grad()
    def self_distillation_sequences(self, num_sequences: int, seed: int, unconditional_fraction: float = 0.1,
                                    batch_size: int = 16):
        """Sequences the target samples itself (temperature 1, no guidance), to train drafting heads without a
        dataset: the bench inputs (classes or captions), a fraction replaced by the family's unconditional
        prompt so heads also draft for guidance's unconditional rows.

        Returns (adapter, ids [N, P + codes] left-padded, mask, first_code [N]: where each row's codes begin
        among its real tokens). Deterministic in `seed`.
        """
        from mmspec.common.decoder import SpeculativeDecoder

        model = self.image_model
        grid = model.code_grid(None, None)
        adapter = model.adapter(grid)
        gen = torch.Generator().manual_seed(seed)
        rows = model.prompt_rows(self.bench_inputs(num_sequences, seed), grid)
        unconditional = model.unconditional_rows(rows, grid)
        drop = (torch.rand(num_sequences, generator=gen) < unconditional_fraction).tolist()
        rows = [u if d else r for r, u, d in zip(rows, unconditional, drop)]
        ids, mask = _left_pad(rows, model.pad_token_id)
        ids = model.prompt_ids(ids).to(self.device)
        mask = mask.to(self.device)
        decoder = SpeculativeDecoder(adapter, logits=LogitsPipeline(temperature=1.0))
        codes = []
        for start in range(0, num_sequences, batch_size):
            end = min(start + batch_size, num_sequences)
            gens = [torch.Generator(self.device).manual_seed(seed * 100_003 + i) for i in range(start, end)]
            out = decoder.generate(ids[start:end], mask[start:end], max_new_tokens=grid[0] * grid[1], generator=gens)
            codes.append(out.sequences)
        codes = torch.cat(codes)
        return (adapter, torch.cat([ids, codes], 1), torch.cat([mask, torch.ones_like(codes)], 1),
                mask.sum(1))

    def continuous_batching_blocker(self) -> str | None:
        from mmspec.common.pipeline import refill_blocker

        grid = self.image_model.code_grid(None, None)
        target = CFGModel(self.image_model.adapter(grid), self.call_defaults["guidance_scale"])
        return refill_blocker(self.build_decoder(DecodeRequest(target, LogitsPipeline(), self.code_structure(grid))))

    # --- batch protocol (see mmspec.common.batch) ------------------------
    batch_suffix = ".png"

    @property
    def batch_fields(self) -> dict:
        if self.is_class_conditional:
            return {"class_label": f"int class index in [0, {self.num_classes})"}
        return {"prompt": "text prompt"}

    def batch_input(self, record: dict, base_dir):
        (field, _), = self.batch_fields.items()
        if field not in record:
            raise ValueError(f"field {field!r} is missing ({self.batch_fields[field]})")
        value = record[field]
        if field == "class_label" and (isinstance(value, bool) or not isinstance(value, int)
                                       or not 0 <= value < self.num_classes):
            raise ValueError(f"field 'class_label' must be an int in [0, {self.num_classes}), got {value!r}")
        if field == "prompt" and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"field 'prompt' must be a non-empty string, got {value!r}")
        return value

    def batch_generate(self, inputs: list, generators: list, call: dict, on_sample_done) -> DecodeStats:
        with self._progress_bar_off():
            return self(**{self._input_key: inputs}, generator=generators, output_type="pil",
                        on_sample_done=on_sample_done, **call).stats

    def batch_write(self, output, path) -> None:
        output.save(path, format="PNG")

    def cli_inputs(self, args):
        """--num inputs cycling through the --class-label values or --prompt texts (whichever this model takes;
        the other is an error), default: through every class or the built-in captions."""
        if self.is_class_conditional:
            if args.prompt:
                raise ValueError(f"--prompt: this pipeline's {type(self.transformer).__name__} is class-conditional; "
                                 f"use --class-label (0..{self.num_classes - 1})")
            given = args.class_label
        else:
            if args.class_label:
                raise ValueError(f"--class-label: this pipeline's {type(self.transformer).__name__} is text-to-image; "
                                 "use --prompt TEXT")
            given = args.prompt
        if not given:
            return self.bench_inputs(args.num, args.seed), True
        return [given[i % len(given)] for i in range(max(args.num, len(given)))], True

    def cli_generate(self, args, call: dict) -> int:
        """`mmspec generate PLUGIN --num N --out grid.png`: N images cycling through the classes or prompts,
        one grid column per distinct input."""
        from .data import CLASS_NAMES
        from .metrics import save_image_grid

        inputs, _ = self.cli_inputs(args)
        self.check_inputs(inputs if self.is_class_conditional else None, 1.0, 1, "pt",
                          prompt=None if self.is_class_conditional else inputs)
        codes, stats = self.bench_generate(inputs, args.batch_size, args.seed, call)
        images = self.decode_tokens(torch.tensor(codes)).cpu()
        out = args.out or "grid.png"
        save_image_grid(images, rows=-(-len(images) // len(set(inputs))), path=out)  # a column per input
        if self.is_class_conditional:
            shown = "classes: " + ", ".join(CLASS_NAMES[c] if c < len(CLASS_NAMES) else str(c) for c in inputs)
        else:
            shown = "prompts: " + "; ".join(dict.fromkeys(inputs))
        print(f"wrote {len(images)} images to {out} ({shown})")
        print(stats)
        return 0

    @staticmethod
    def postprocess(images: torch.Tensor, output_type: str):
        if output_type == "pt":
            return images.cpu()
        array = rearrange(images, "n c h w -> n h w c").float().cpu().numpy()
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
