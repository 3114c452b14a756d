"""Untrained `ptp` registers for a model: enough to prove exactness on any adapter (not speed)."""

import torch

from mmspec.plugins.ptp.registers import RegisterSet, adaptable_linears


def random_registers(model, k: int, adapter_under: str | None = None, rank: int = 4, seed: int = 0,
                     scale: float = 1.0) -> RegisterSet:
    """Untrained registers for `model` (adapters with a non-zero up projection, so they do change registers)."""
    torch.manual_seed(seed)
    linears = adaptable_linears(model, adapter_under) if adapter_under else []
    registers = RegisterSet(num_registers=k, hidden_size=model.get_input_embeddings().weight.shape[1],
                            vocab_size=model.get_output_embeddings().weight.shape[0],
                            adapter_modules=tuple(n for n, _ in linears),
                            adapter_shapes=tuple((m.in_features, m.out_features) for _, m in linears),
                            adapter_rank=rank if linears else 0)
    with torch.no_grad():
        registers.embeddings.mul_(scale / 0.02)
        for up in registers.up:
            up.normal_(0, 0.1)
    return registers.eval()
