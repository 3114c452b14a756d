"""One end-to-end decode per Triton kernel, on purpose: the rest of the suite decodes with the kernels' torch
references (tests/conftest.py sets MMSPEC_KERNELS=torch, because the Triton interpreter costs milliseconds a
launch on a CPU), so here each plugin that owns a kernel decodes a bundled model with MMSPEC_KERNELS=triton
and must give exactly the tokens of the torch path — and the kernel must really have taken the Triton branch.
The kernels themselves are tested against their references, row by row, beside each plugin."""

import importlib
import os

import pytest
import torch

from mmspec import load_plugin
from mmspec.common.kernels import HAS_TRITON

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not HAS_TRITON or os.environ.get("TRITON_INTERPRET") != "1",
                                                  reason="needs triton with TRITON_INTERPRET=1 set before import")]

# (plugin, model, settings, the kernel module that must run on Triton)
CASES = [
    ("speculative", "text-tiny", {"temperature": 0.0, "max_new_tokens": 12}, "mmspec.common.kernels.accept"),
    ("speculative", "text-tiny", {"temperature": 1.0, "max_new_tokens": 12}, "mmspec.common.kernels.accept"),
    ("mc_sjd", "llamagen-tiny", {}, "mmspec.plugins.jacobi.kernels"),
    ("gsd", "llamagen-tiny", {}, "mmspec.plugins.jacobi.kernels"),
    ("lantern", "llamagen-tiny", {}, "mmspec.plugins.lantern.kernels"),
    ("ptp", "doc-tiny", {"temperature": 0.0, "max_new_tokens": 24}, "mmspec.plugins.ptp.kernels"),
    ("ctc_draft", "asr-tiny", {"mode": "relaxed"}, "mmspec.plugins.ctc_draft.kernels"),
]


def decode(pipe, settings: dict) -> list[list[int]]:
    call = {**pipe.call_defaults, **pipe.bench_settings, **settings}
    inputs = pipe.bench_inputs(1, 0, **{k: call[k] for k in pipe.bench_input_settings})
    sequences, _ = pipe.bench_generate(inputs, 1, 0, call)
    return sequences


@pytest.mark.parametrize("plugin, model, settings, module", CASES,
                         ids=[f"{c[0]}-{c[2].get('temperature', c[2].get('mode', 'default'))}" for c in CASES])
def test_the_triton_path_decodes_the_same_tokens_as_the_torch_path(monkeypatch, plugin, model, settings, module):
    config = {k: v for k, v in settings.items() if k == "mode"}
    pipe = load_plugin(plugin, model=model, **config)
    call_settings = {k: v for k, v in settings.items() if k != "mode"}
    torch.manual_seed(0)
    monkeypatch.setenv("MMSPEC_KERNELS", "torch")
    reference = decode(pipe, call_settings)

    kernels = importlib.import_module(module)
    real, chosen = kernels.kernel_backend, []

    def spy(device):
        chosen.append(real(device))
        return chosen[-1]

    monkeypatch.setattr(kernels, "kernel_backend", spy)
    monkeypatch.setenv("MMSPEC_KERNELS", "triton")
    torch.manual_seed(0)
    assert decode(pipe, call_settings) == reference
    assert "triton" in chosen, f"{module} never took its Triton branch"
