"""Text substrate: `TextPipeline` over any causal LM pair, and the bundled byte-level pair (`text-tiny`),
the test bed of the `speculative` plugin."""

from mmspec.common.registry import register_bundled_model, register_pipeline

register_pipeline("text", "mmspec.text.pipeline:TextPipeline", spec="mmspec.text.spec:TEXT_SPEC")
register_bundled_model("text-tiny", "mmspec.text.pipeline:bundled_pipeline", modality="text", default=True,
                       pipeline="text")
