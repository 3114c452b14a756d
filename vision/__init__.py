"""Image substrate (VQ tokenizer, AR image models, ARImagePipeline): arrives with the vision-substrate issue."""
