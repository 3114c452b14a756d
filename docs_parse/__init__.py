"""Document-parsing substrate: rendered pages with layout ground truth (`pages`), the page VLM's tokenizer,
prompts and `ARModel` adapter over GOT-OCR2-style models (`model`), its training examples (`training`),
`DocParsePipeline` (page, layout and region-prompted modes; `pipeline`) and OmniDocBench-style metrics
(`metrics`)."""

from mmspec.common.registry import register_bundled_model, register_pipeline

register_pipeline("docs", "mmspec.docs_parse.pipeline:DocParsePipeline", spec="mmspec.docs_parse.spec:DOC_SPEC")
# A 5.3M-parameter GOT-OCR2 (3-layer ViT, 4-layer Qwen2) trained on rendered pages (examples/train_doc_vlm.py).
register_bundled_model("doc-tiny", "mmspec.docs_parse.pipeline:bundled_pipeline", modality="docs", default=True,
                       pipeline="docs",
                       bench_ar_rows=({"mode": "page"}, {"mode": "layout+regions"},
                                      {"mode": "layout+regions", "stream": False}, {"mode": "layout"}))


def render_pdf(path, dpi: int = 150, pages=None):
    """Pages of a PDF (all, or the 0-based `pages`) as RGB PIL images; see `pipeline.render_pdf`."""
    from .pipeline import render_pdf as render

    return render(path, dpi, pages)
