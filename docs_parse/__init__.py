"""Document-parsing substrate: rendered pages with layout ground truth (`pages`), the page VLM's tokenizer,
prompts and `ARModel` adapter over GOT-OCR2-style models (`model`), its training examples (`training`) and
OmniDocBench-style metrics (`metrics`). `DocParsePipeline` and the bundled checkpoint arrive with the rest of
the documents issue."""
