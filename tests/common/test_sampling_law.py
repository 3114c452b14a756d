"""Speculative sampling is lossless in law: its samples follow the target, and a biased rule is caught.

Small vocabulary (5), three generated tokens, all of them speculative (the
last prompt token is verified together with the first drafts), 30k samples.
The exact target law of the 125 three-token sequences is computed by
enumeration and compared with a chi-square goodness-of-fit test.
"""

import itertools

import pytest
import torch
from law import AcceptAll, ResidualFromTarget, gof_pvalue
from scipy.stats import chi2_contingency
from tiny_models import perturbed_copy, tiny_llama

from mmspec.common.accept import SpeculativeSampling
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.draft import DraftModelDrafter
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import HFCausalLM
from mmspec.common.tree import TreeSpec

VOCAB, NEW_TOKENS, SAMPLES = 5, 3, 30_000
PROMPT = [1, 2]


@pytest.fixture(scope="module")
def small_pair():
    target = tiny_llama(vocab_size=VOCAB, hidden=16, seed=21)
    with torch.no_grad():  # random init is near-uniform; sharpen it so the law has structure
        target.lm_head.weight.mul_(12.0)
    draft = perturbed_copy(target, noise=0.5, seed=5)
    return target, draft


def exact_law(model, logits: LogitsPipeline) -> torch.Tensor:
    """[V**3] probability of every 3-token continuation under the processed target."""
    seqs = torch.tensor(list(itertools.product(range(VOCAB), repeat=NEW_TOKENS)))
    ids = torch.cat([torch.tensor(PROMPT).expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        probs = logits.probs(model(input_ids=ids).logits[:, len(PROMPT) - 1:-1])
    return probs.gather(2, seqs[:, :, None]).squeeze(2).prod(1)


def sample_counts(decoder, seed=0, with_stats=False):
    ids = torch.tensor(PROMPT).expand(SAMPLES, -1)
    out = decoder.generate(ids, max_new_tokens=NEW_TOKENS, generator=torch.Generator().manual_seed(seed))
    code = (out.sequences * torch.tensor([VOCAB ** 2, VOCAB, 1])).sum(1)
    counts = torch.bincount(code, minlength=VOCAB ** NEW_TOKENS)
    return (counts, out.stats) if with_stats else counts


def decoder_for(pair, rule, logits, k=2, tree=None, dynamic=None):
    target, draft = pair
    return SpeculativeDecoder(HFCausalLM(target), DraftModelDrafter(HFCausalLM(draft), tree=tree, dynamic=dynamic),
                              rule, logits, num_draft_tokens=0 if tree or dynamic else k)


LOGITS = [LogitsPipeline(temperature=1.0), LogitsPipeline(temperature=0.7, top_k=3),
          LogitsPipeline(temperature=1.3, top_p=0.8)]


@pytest.mark.parametrize("logits", LOGITS, ids=["t1", "t0.7-topk3", "t1.3-topp0.8"])
def test_speculative_sampling_matches_target_law(small_pair, logits, torch_kernels):
    law = exact_law(small_pair[0], logits)
    counts, stats = sample_counts(decoder_for(small_pair, SpeculativeSampling(), logits), with_stats=True)
    assert gof_pvalue(counts, law) > 1e-3
    # Both branches of the rule are exercised: many drafts accepted, many rejected.
    assert 0.2 < stats.acceptance_per_position[0] < 0.95


def test_speculative_sampling_matches_plain_ar_samples(small_pair, torch_kernels):
    logits = LogitsPipeline(temperature=1.0)
    spec = sample_counts(decoder_for(small_pair, SpeculativeSampling(), logits), seed=1)
    ar = sample_counts(SpeculativeDecoder(HFCausalLM(small_pair[0]), logits=logits), seed=2)
    both = torch.stack([spec, ar])
    both = both[:, both.sum(0) > 0]
    assert chi2_contingency(both.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("branching", [[2, 1], [3]])
def test_tree_sampling_matches_target_law(small_pair, branching, torch_kernels):
    logits = LogitsPipeline(temperature=1.0)
    law = exact_law(small_pair[0], logits)
    counts = sample_counts(decoder_for(small_pair, SpeculativeSampling(), logits, tree=TreeSpec.full(branching)))
    assert gof_pvalue(counts, law) > 1e-3


@pytest.mark.parametrize("dynamic", [(3, 2, 4), (3, 3, 7)])
def test_dynamic_tree_sampling_matches_target_law(small_pair, dynamic, torch_kernels):
    """EAGLE-2 trees differ per row and step (they follow the draft's confidence), yet the output law is the
    target's: children are deterministic proposals tried by multi-candidate rejection."""
    logits = LogitsPipeline(temperature=1.0)
    law = exact_law(small_pair[0], logits)
    counts, stats = sample_counts(decoder_for(small_pair, SpeculativeSampling(), logits, dynamic=dynamic),
                                  with_stats=True)
    assert gof_pvalue(counts, law) > 1e-3
    assert stats.mean_accepted > 1.2  # drafts are kept: the test exercises acceptance, not only corrections


@pytest.mark.parametrize("rule", [AcceptAll(), ResidualFromTarget()], ids=["accept-all", "no-residual"])
def test_biased_rules_are_rejected(small_pair, rule, torch_kernels):
    logits = LogitsPipeline(temperature=1.0)
    law = exact_law(small_pair[0], logits)
    counts = sample_counts(decoder_for(small_pair, rule, logits))
    assert gof_pvalue(counts, law) < 1e-6


def test_draft_differs_enough_for_the_test_to_have_power(small_pair):
    """Guard: if the draft were nearly the target, the biased-rule tests would prove nothing."""
    logits = LogitsPipeline(temperature=1.0)
    assert 0.5 * (exact_law(small_pair[0], logits) - exact_law(small_pair[1], logits)).abs().sum() > 0.15
