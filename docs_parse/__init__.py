"""Document-parsing substrate (page data, VLM parsers, DocParsePipeline): arrives with the documents issue."""
