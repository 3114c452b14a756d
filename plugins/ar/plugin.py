"""`ar`: plain autoregressive decoding through the same loop as every plugin (one token per forward)."""

from mmspec.common.decoder import autoregressive_decoder
from mmspec.common.plugin import NoConfig, Plugin
from mmspec.common.registry import register_plugin


@register_plugin("ar")
class AutoregressivePlugin(Plugin):
    modality = "any"
    lossless = True
    paper = "baseline"
    Config = NoConfig

    def build_decoder(self, pipeline, request):
        return autoregressive_decoder(request)
