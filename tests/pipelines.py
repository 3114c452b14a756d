"""Every pipeline the contract tests run over: each registered bundled model, and tiny Hugging Face image
pipelines (Janus, Emu3, Chameleon) built offline. Loaded once per test session."""

import functools

import torch
from tiny_models import HF_CODES, HF_GRID, build_tiny_chameleon, build_tiny_emu3, build_tiny_janus, tiny_text_tokenizer

from mmspec.common.loading import load_bundled_pipeline
from mmspec.common.registry import bundled_models


def tiny_janus_pipeline():
    """A new image pipeline over a tiny random Janus (text-to-image), built offline; not cached, for tests
    that change the pipeline."""
    from mmspec.vision.pipeline import ARImagePipeline

    return ARImagePipeline(build_tiny_janus(), tokenizer=tiny_text_tokenizer(boi_token="<begin_of_image>"))


def _tiny_hf_image(name):
    from diffusers import VQModel

    from mmspec.vision.pipeline import ARImagePipeline

    if name == "janus-tiny":
        return tiny_janus_pipeline()
    if name == "emu3-tiny":
        return ARImagePipeline(build_tiny_emu3(), tokenizer=tiny_text_tokenizer(
            boi_token="<|image start|>", image_wrapper_token="<|image token|>"))
    torch.manual_seed(0)
    vq = VQModel(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                 up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), layers_per_block=1,
                 latent_channels=4, num_vq_embeddings=HF_CODES, vq_embed_dim=4, norm_num_groups=4,
                 sample_size=2 * HF_GRID)
    return ARImagePipeline(build_tiny_chameleon(), vqvae=vq.eval(), tokenizer=tiny_text_tokenizer())


TINY_HF = ("janus-tiny", "emu3-tiny", "chameleon-tiny")
PIPELINES = tuple(bundled_models()) + TINY_HF


@functools.lru_cache(maxsize=None)
def pipeline(name):
    pipe = _tiny_hf_image(name) if name in TINY_HF else load_bundled_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def inputs(name, num):
    """`num` inputs: the bundled pipeline's own bench inputs, prompts for the tiny text-to-image models
    (their bench has no labelled data; tiny tokenizer: a -> 10, b -> 11, ...)."""
    if name in TINY_HF:
        return [("a b", "c", "d e f")[i % 3] for i in range(num)]
    return pipeline(name).bench_inputs(num, 0)


def settings(name, **overrides):
    """The pipeline's call settings (its defaults) with `overrides`; Emu3's tiny VQ decodes 4x4 codes, not
    Emu3's default 90x90; the TTS model speaks 12 frames, not 250."""
    size = {"height": 2 * HF_GRID, "width": 2 * HF_GRID} if name == "emu3-tiny" else {}
    short = {}
    if name == "tts-tiny":
        short = {"max_new_frames": 12}  # half a second of speech keeps tests quick
        if overrides.get("temperature") == 0:  # greedy means both levels: the depth decoder samples too
            short["depth_temperature"] = 0.0
    if name == "doc-tiny":
        short = {"max_new_tokens": 48}  # the start of each page's markdown
    return {**pipeline(name).call_defaults, **size, **short, **overrides}


def call(name, pipe, items, **kwargs):
    """Call `pipe` directly on `items` from `inputs(name, ...)` (each pipeline names its input its own way)."""
    from mmspec.docs_parse.pipeline import DocParsePipeline
    from mmspec.speech.pipeline import ASRPipeline
    from mmspec.speech.tts_pipeline import TTSPipeline
    from mmspec.vision.pipeline import ARImagePipeline

    kwargs = {**settings(name), **kwargs}
    if isinstance(pipe, ARImagePipeline):
        key = "class_labels" if pipe.is_class_conditional else "prompt"
        return pipe(**{key: items}, **kwargs)
    if isinstance(pipe, ASRPipeline):
        return pipe([row["audio"] for row in items], **kwargs)
    if isinstance(pipe, TTSPipeline):
        return pipe([row["text"] for row in items], **kwargs)
    if isinstance(pipe, DocParsePipeline):
        return pipe([row["image"] for row in items], **kwargs)
    return pipe(items, **kwargs)
