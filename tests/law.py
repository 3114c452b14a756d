"""Shared pieces of the output-law tests: the chi-square goodness of fit, exact laws by enumeration, and the
planted bugs those tests must catch."""

import itertools

import torch
from scipy.stats import chisquare

from mmspec.common.accept import Acceptance, AcceptRule, SpeculativeSampling
from mmspec.common.kernels import assemble_tokens, sample_inverse_cdf, speculative_accept_reference
from mmspec.common.logits import draw_uniform


def gof_pvalue(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Chi-square goodness of fit of observed sequence counts against an exact law."""
    expected = law.double() * counts.sum()
    keep = expected >= 5  # chi-square needs populated cells; pool the rest into one
    obs = torch.cat([counts[keep].double(), counts[~keep].double().sum()[None]])
    exp = torch.cat([expected[keep], expected[~keep].sum()[None]])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue)


def sequence_codes(sequences: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N, L] token rows -> [N] index of each row among the vocab**L sequences (first token most significant)."""
    length = sequences.shape[1]
    return (sequences * vocab ** torch.arange(length - 1, -1, -1)).sum(1)


def class_grid_law(model, label: int, num_tokens: int) -> torch.Tensor:
    """Exact law of the first `num_tokens` codes of a class-conditional LlamaGenModel, by enumeration."""
    vocab = model.config.vocab_size
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=num_tokens)))
    cls = model.class_token(torch.full((len(seqs), 1), label))
    with torch.no_grad():
        probs = model(torch.cat([cls, seqs], 1)).float().softmax(-1)[:, :-1]
    return probs.gather(2, seqs[:, :, None]).squeeze(2).prod(1)


def speculative_accept_residual_from_target(draft_tokens, draft_probs, target_probs, uniforms, residual_uniform):
    """Planted bug in `speculative_accept_reference`'s signature: the same test, but the extra token is drawn
    from p at the first rejection instead of max(p − q, 0)."""
    num, _ = speculative_accept_reference(draft_tokens, draft_probs, target_probs, uniforms, residual_uniform)
    rows = torch.arange(draft_tokens.shape[0], device=draft_tokens.device)
    extra = sample_inverse_cdf(target_probs[rows, num], residual_uniform)
    return num, assemble_tokens(draft_tokens, num, extra)


class ResidualFromTarget(SpeculativeSampling):
    """Planted bug: on rejection resample from p instead of max(p − q, 0)."""

    def __call__(self, draft, target_probs, generator=None):
        batch, k = draft.tokens.shape
        u = draw_uniform(generator, batch, k + 1, target_probs.device)
        num, tokens = speculative_accept_residual_from_target(draft.tokens, draft.probs, target_probs, u[:, :k],
                                                              u[:, k])
        return Acceptance(num, tokens)


class AcceptAll(AcceptRule):
    """Planted bug: keep every draft, so the output follows the drafter, not the target."""

    name = "accept_all"
    lossless = False

    def __call__(self, draft, target_probs, generator=None):
        if draft.tree is not None:
            return self._first_children(draft, target_probs, generator)
        batch, k = draft.tokens.shape
        uniforms = draw_uniform(generator, batch, 1, target_probs.device)
        bonus = sample_inverse_cdf(target_probs[:, k], uniforms[:, 0])
        num = torch.full((batch,), k, dtype=torch.long, device=draft.tokens.device)
        return Acceptance(num, assemble_tokens(draft.tokens, num, bonus))

    @staticmethod
    def _first_children(draft, target_probs, generator):
        """Trees: keep the path of first-ranked children down to a leaf."""
        path = [0]
        while draft.tree.children(path[-1]):
            path.append(draft.tree.children(path[-1])[0])
        batch, device = draft.tokens.shape[0], draft.tokens.device
        nodes = torch.tensor(path, device=device)
        uniforms = draw_uniform(generator, batch, 1, target_probs.device)
        bonus = sample_inverse_cdf(target_probs[:, path[-1]], uniforms[:, 0])
        num = torch.full((batch,), len(path) - 1, dtype=torch.long, device=device)
        tokens = assemble_tokens(draft.tokens[:, nodes[1:] - 1], num, bonus)
        return Acceptance(num, tokens, path_nodes=nodes[None].expand(batch, -1).clone())


# --- a 4-token LM whose law over a few new tokens is enumerable (decoder-level law tests) ------------------

def sharpened_tiny_lm(vocab: int = 4, seed: int = 21, scale: float = 12.0):
    """A tiny Llama with a sharpened output layer: the near-uniform random init gets structure."""
    from tiny_models import tiny_llama

    model = tiny_llama(vocab_size=vocab, hidden=16, seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def exact_prompt_law(model, logits, prompt: list[int], new_tokens: int) -> torch.Tensor:
    """Exact law of the next `new_tokens` tokens after `prompt` under the processed distributions."""
    vocab = model.config.vocab_size
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=new_tokens)))
    ids = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], 1)
    with torch.no_grad():
        probs = logits.probs(model(input_ids=ids).logits[:, len(prompt) - 1:-1])
    return probs.gather(2, seqs[:, :, None]).squeeze(2).prod(1)


def prompt_law_pvalue(decoder, law, prompt: list[int], vocab: int, new_tokens: int, samples: int, seed: int = 0):
    """Generate `samples` continuations of `prompt` in one batch; chi-square p-value against `law`, and stats."""
    ids = torch.tensor(prompt).expand(samples, -1)
    out = decoder.generate(ids, max_new_tokens=new_tokens, generator=torch.Generator().manual_seed(seed))
    counts = torch.bincount(sequence_codes(out.sequences, vocab), minlength=vocab ** new_tokens)
    return gof_pvalue(counts, law), out.stats
