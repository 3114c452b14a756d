"""Tiny random models shared by the tests (importable because pyproject puts tests/ on pythonpath)."""

import torch


def tiny_llama(vocab_size=64, layers=2, hidden=32, seed=0, eos_token_id=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, bos_token_id=0, eos_token_id=eos_token_id,
                         pad_token_id=None, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def perturbed_copy(model, noise: float, seed: int = 1):
    """A draft that agrees with the target often but not always: ragged acceptance."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise * p.std().clamp(min=1e-3))
    return draft.eval()
