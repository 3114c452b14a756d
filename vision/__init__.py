"""Image substrate: VQ tokenizer, AR image models and their adapters (bundled LlamaGen-style GPT, Hugging
Face Janus / Emu3 / Chameleon), `ARImagePipeline`, image data and metrics, bundled checkpoints."""

from mmspec.common.registry import register_bundled_model, register_pipeline

# A diffusers folder (model_index.json) without mmspec's own marker is an image pipeline's.
register_pipeline("image", "mmspec.vision.pipeline:ARImagePipeline", spec="mmspec.vision.spec:IMAGE_SPEC",
                  folder_marker="model_index.json")
# The project's default model: `load_plugin("ar")` generates images.
# The bench documents its own quality with and without guidance.
register_bundled_model("llamagen-tiny", "mmspec.vision.pipeline:bundled_pipeline", modality="vision",
                       pipeline="image", default=True, project_default=True,
                       bench_ar_rows=({"guidance_scale": 3.0}, {"guidance_scale": 1.0}))
