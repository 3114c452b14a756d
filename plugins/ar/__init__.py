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

    def build_decoder(self, pipeline, target, logits, *, eos_token_id=None, pad_token_id=-1, grid=None):
        rule = GreedyMatch() if logits.greedy else SpeculativeSampling()
        return SpeculativeDecoder(target, None, rule, logits, num_draft_tokens=0,
                                  eos_token_id=eos_token_id, pad_token_id=pad_token_id)
