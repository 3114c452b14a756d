"""`ar`: plain autoregressive decoding through the same loop as every plugin (one token per forward)."""

from mmspec.common.accept import GreedyMatch, SpeculativeSampling
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.plugin import NoConfig, Plugin
from mmspec.common.registry import register_plugin


@register_plugin("ar")
class AutoregressivePlugin(Plugin):
    modality = "any"
    lossless = True
    paper = "baseline"
    Config = NoConfig

    def build_decoder(self, pipeline, request):
        rule = GreedyMatch() if request.logits.greedy else SpeculativeSampling()
        return SpeculativeDecoder(request.target, None, rule, request.logits, num_draft_tokens=0,
                                  eos_token_id=request.eos_token_id, pad_token_id=request.pad_token_id)
