"""Learnable register tokens for parallel-token prediction, and how they ride along a frozen model's forward.

A register group is k extra inputs placed after a real token t: register j (1-based) sits at position t+j and
is trained to predict token t+1+j, the token j steps beyond the model's own next-token prediction. Registers
attend to the causal prefix and to the earlier registers of their group; ordinary tokens never attend to
registers, so the model's own path is untouched.

What a `RegisterSet` adds to a model, and nothing else is trained:

- k register embeddings, fed in place of the token embedding wherever the input id is `vocab_size + j - 1`;
- optionally low-rank adapters on named linear layers, applied only at register positions (the gate is the
  same "is a register" mask), so every ordinary position computes exactly what the frozen model computes.

`inject(module, embedding, vocab_size)` installs both as hooks for the duration of a `with` block: a forward
pre-hook on the token embedding maps register ids to a valid id and records where they are, a forward hook
puts the register vectors there, and forward hooks on the adapted linears add their low-rank update at those
positions only (`torch.where`, so ordinary positions are bit-identical, not merely close). Because the hooks
wrap the model's own modules, the same code path runs in training (`examples/train_ptp.py`) and decoding,
for the bundled page VLM and for any `transformers` model an `ARModel` adapter names its embedding for.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config


class RegisterSet(ModelMixin, ConfigMixin):
    """k register embeddings (+ optional gated low-rank adapters) for one model; saved like a diffusers model."""

    @register_to_config
    def __init__(self, num_registers: int = 8, hidden_size: int = 256, vocab_size: int = 1024,
                 adapter_modules: tuple = (), adapter_shapes: tuple = (), adapter_rank: int = 0,
                 adapter_alpha: float = 16.0, model_type: str = ""):
        super().__init__()
        if num_registers < 1:
            raise ValueError(f"num_registers must be >= 1, got {num_registers}")
        if len(adapter_modules) != len(adapter_shapes):
            raise ValueError("adapter_modules and adapter_shapes must have one entry each")
        if adapter_modules and adapter_rank < 1:
            raise ValueError(f"adapter_rank must be >= 1 when adapter_modules are given, got {adapter_rank}")
        self.embeddings = nn.Parameter(torch.randn(num_registers, hidden_size) * 0.02)
        # ModuleDict keys cannot hold dots: the i-th adapter belongs to adapter_modules[i].
        self.down = nn.ParameterList()
        self.up = nn.ParameterList()
        for in_features, out_features in adapter_shapes:
            self.down.append(nn.Parameter(torch.randn(adapter_rank, in_features) / in_features ** 0.5))
            self.up.append(nn.Parameter(torch.zeros(out_features, adapter_rank)))  # starts as no change

    @property
    def num_registers(self) -> int:
        return self.config.num_registers

    def register_ids(self, count: int, device=None) -> torch.Tensor:
        """Input ids of registers 1..count (`vocab_size + j - 1`)."""
        if not 1 <= count <= self.num_registers:
            raise ValueError(f"k must be between 1 and {self.num_registers} (the registers trained), got {count}")
        return torch.arange(count, device=device) + self.config.vocab_size

    def check_model(self, embedding: nn.Module, vocab_size: int, module: nn.Module, where: str) -> None:
        """One clear error when these registers were trained for another model."""
        width = embedding.weight.shape[1]
        if width != self.config.hidden_size:
            raise ValueError(f"{where}: the registers are {self.config.hidden_size} wide, this model's token "
                             f"embeddings are {width} wide (registers trained for another model); train registers "
                             "for it with examples/train_ptp.py")
        if vocab_size != self.config.vocab_size:
            raise ValueError(f"{where}: the registers were trained for a {self.config.vocab_size}-token vocabulary, "
                             f"this model has {vocab_size} (registers trained for another model)")
        for name, (fan_in, fan_out) in zip(self.config.adapter_modules, self.config.adapter_shapes):
            try:
                linear = module.get_submodule(name)
            except AttributeError:
                raise ValueError(f"{where}: the registers adapt {name!r}, which this model lacks (registers "
                                 "trained for another model)") from None
            if tuple(linear.weight.shape) != (fan_out, fan_in):
                raise ValueError(f"{where}: {name} is {tuple(linear.weight.shape)} here but the adapter was trained "
                                 f"for {(fan_out, fan_in)} (registers trained for another model)")


def adaptable_linears(module: nn.Module, under: str) -> list[tuple[str, nn.Linear]]:
    """The nn.Linear layers below `under` (e.g. the text decoder's layers), by name relative to `module`."""
    root = module.get_submodule(under)
    return [(f"{under}.{name}", m) for name, m in root.named_modules() if isinstance(m, nn.Linear)]


@contextmanager
def inject(registers: RegisterSet, module: nn.Module, embedding: nn.Module, vocab_size: int):
    """Within the block, input ids >= `vocab_size` are registers in every forward of `module` (see the module
    docstring). `embedding` is the token embedding the model's forward calls."""
    # The current forward's register mask [B, L], set by the embedding pre-hook; "any" is read once there (one
    # device sync per forward, not one per adapted layer).
    gate: dict = {"any": False}

    def before_embedding(_, args):
        ids = args[0]
        is_register = ids >= vocab_size
        gate["mask"] = is_register
        gate["index"] = (ids - vocab_size).clamp(min=0)
        gate["any"] = bool(is_register.any())
        if gate["any"]:
            return (torch.where(is_register, torch.zeros_like(ids), ids),) + tuple(args[1:])
        return None

    def after_embedding(_, args, output):
        mask = gate["mask"]
        if not gate["any"]:
            return output
        vectors = registers.embeddings[gate["index"]].to(output.dtype)
        return torch.where(mask[..., None], vectors, output)

    def adapter_hook(i):
        def hook(_, args, output):
            mask = gate.get("mask")
            if not gate["any"] or output.shape[:-1] != mask.shape:
                return output
            scale = registers.config.adapter_alpha / registers.config.adapter_rank
            x = args[0].to(registers.down[i].dtype)
            update = (x @ registers.down[i].T @ registers.up[i].T) * scale
            return torch.where(mask[..., None], output + update.to(output.dtype), output)
        return hook

    handles = [embedding.register_forward_pre_hook(before_embedding),
               embedding.register_forward_hook(after_embedding)]
    try:
        for i, name in enumerate(registers.config.adapter_modules):
            handles.append(module.get_submodule(name).register_forward_hook(adapter_hook(i)))
        yield
    finally:
        for handle in handles:
            handle.remove()
