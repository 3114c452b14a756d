"""`speculative`: classic speculative decoding with a separate draft model.

Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling". Greedy: drafts kept while they match the target's
argmax. Sampling: accept with min(1, p/q), resample from max(p - q, 0).
Optionally a static tree of the draft's top-ranked tokens (greedy or
multi-candidate rejection sampling).
"""

from __future__ import annotations


import torch

from mmspec.common.accept import GreedyMatch, SpeculativeSampling
from mmspec.common.bench_run import cut_after, run_peer
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.draft import DraftModelDrafter
from mmspec.common.dynamic_tree import dynamic_tree_settings
from mmspec.common.plugin import Plugin
from mmspec.common.registry import register_plugin
from mmspec.common.structure import TokenSequence
from mmspec.common.tree import parse_branching

from .config import SpeculativeConfig


@register_plugin("speculative")
class SpeculativePlugin(Plugin):
    modality = "text"
    lossless = True
    paper = "Leviathan et al. 2023 / Chen et al. 2023 (arXiv:2211.17192, 2302.01318)"
    Config = SpeculativeConfig
    requires = TokenSequence
    needs_draft_model = True
    bench_variants = ({"settings": {"tree_branching": "3,2,1"}}, {"settings": {"num_draft_tokens": 3}},
                      {"settings": {"tree_depth": 4, "tree_top_k": 3, "tree_total_tokens": 9}})

    def __init__(self, **config):
        super().__init__(**config)
        self.tree = parse_branching(self.config.tree_branching, "SpeculativeConfig.tree_branching")
        self.dynamic = dynamic_tree_settings(self.config, self.tree, "SpeculativeConfig")

    def build_decoder(self, pipeline, request):
        if request.draft_model is None:
            raise ValueError("plugin 'speculative' needs a draft model: give the pipeline draft_model=")
        rule = GreedyMatch() if request.logits.greedy else SpeculativeSampling()
        drafter = DraftModelDrafter(request.draft_model, tree=self.tree, dynamic=self.dynamic)
        chain = self.tree is None and self.dynamic is None
        return SpeculativeDecoder(request.target, drafter, rule, request.logits,
                                  num_draft_tokens=self.config.num_draft_tokens if chain else 0,
                                  eos_token_id=request.eos_token_id, pad_token_id=request.pad_token_id)

    @torch.no_grad()
    def bench_peer(self, pipeline, inputs, settings):
        """transformers' assisted generation (`assistant_model=`) on the same pair, one prompt at a time."""
        if self.tree is not None or self.dynamic is not None:  # assisted generation drafts chains only
            return None
        model, draft = pipeline.model, pipeline.draft_model
        greedy = settings.get("temperature", 0.0) == 0

        def generate_one(i, prompt):
            ids, mask = pipeline.encode_batch([prompt])
            torch.manual_seed(i)
            kwargs = dict(do_sample=False) if greedy else dict(
                do_sample=True, temperature=settings["temperature"], top_k=settings.get("top_k") or 0,
                top_p=settings.get("top_p") or 1.0)
            out = model.generate(ids, attention_mask=mask.long(), assistant_model=draft,
                                 max_new_tokens=settings["max_new_tokens"],
                                 num_assistant_tokens=self.config.num_draft_tokens,
                                 num_assistant_tokens_schedule="constant",
                                 eos_token_id=pipeline.eos_token_id, pad_token_id=pipeline.eos_token_id, **kwargs)
            return cut_after(out[0, ids.shape[1]:].tolist(), pipeline.eos_token_id)

        return run_peer(model, "transformers assisted generation", inputs, generate_one)
