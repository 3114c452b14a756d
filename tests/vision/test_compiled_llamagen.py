"""`compile=`: the LlamaGen adapter's step forward through torch.compile at static shapes gives the same greedy
tokens as eager decoding — plain AR, a drafting plugin with ragged acceptance (rows finish at different steps,
so the batch shrinks), guidance, and a cache small enough to be tidied and compacted on the way.

"aot_eager" captures the same graphs without generating code and runs anywhere; "inductor" (generated CPU
kernels) needs a C++ compiler, so its case is in the list where one is on the PATH."""

import pytest
import torch

from mmspec.common import compiled
from mmspec.common.compiled import StaticKV, has_c_compiler, length_bucket
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import CFGModel
from mmspec.common.registry import get_plugin_class
from mmspec.vision.llamagen import LlamaGenAdapter, LlamaGenModel

from ..request_helpers import build_decoder

GRID = 4
TINY = dict(dim=32, n_layer=2, n_head=4, multiple_of=8, num_classes=3, vocab_size=16, block_size=GRID * GRID)
BACKENDS = ["aot_eager"] + (["inductor"] if has_c_compiler() else [])


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LlamaGenModel(**TINY).eval()


def decode(model, plugin, compile, guidance=None, compact_slack=64, labels=(0, 2, 1)):
    labels = torch.tensor(labels)
    cond = model.class_token(labels)[:, None]
    target, prefill = LlamaGenAdapter(model, compact_slack=compact_slack, compile=compile), None
    if guidance is not None:
        uncond = model.class_token(torch.full_like(labels, model.null_class))[:, None]
        target, prefill = CFGModel(target, guidance), (torch.cat([cond, uncond]), None)
    decoder = build_decoder(plugin, target, LogitsPipeline(temperature=0), grid=(GRID, GRID))
    return decoder.generate(cond, max_new_tokens=GRID * GRID, prefill_input=prefill)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_ar_equals_eager(model, backend):
    ar = get_plugin_class("ar")()
    eager = decode(model, ar, None)
    compiled = decode(model, ar, backend)
    assert torch.equal(compiled.sequences, eager.sequences)


@pytest.mark.parametrize("guidance,compact_slack", [(None, 64), (None, 2), (2.5, 2)])
def test_compiled_drafting_plugin_equals_eager(model, guidance, compact_slack):
    sjd = get_plugin_class("sjd")(window=3)
    eager = decode(model, sjd, None, guidance, compact_slack)
    compiled = decode(model, sjd, "aot_eager", guidance, compact_slack)
    assert torch.equal(compiled.sequences, eager.sequences)
    # (Forward counts may differ by a pass: padded shapes round differently, which can flip a draft that a
    # near-uniform random model scores almost evenly; the tokens cannot differ, the rule is lossless.)
    assert len(set(eager.stats.row_forwards)) > 1, "rows should finish at different steps (the batch shrinks)"


def test_compiled_forward_pads_to_buckets_and_keeps_its_buffers(model, monkeypatch):
    adapter = LlamaGenAdapter(model, compile="aot_eager")
    state, out = adapter.prefill(model.class_token(torch.tensor([0, 1, 2]))[:, None])
    assert isinstance(state.cache, StaticKV) and out.logits.shape == (3, 1, 16)
    assert state.cache.row_capacity == 4 and state.cache.slot_capacity == 256
    out = adapter.forward(state, torch.tensor([[1, 2, 3]] * 3), torch.tensor([[1, 2, 3]] * 3))
    assert out.logits.shape == (3, 3, 16) and state.slots.num_slots == 1 + 3  # short feeds run as they are
    assert [length_bucket(n) for n in (1, 17, 32, 33, 70)] == [1, 17, 32, 64, 96]
    monkeypatch.setattr(compiled, "EXACT_LENGTHS", 2)  # the tiny grid is too short for a 33-token feed
    out = adapter.forward(state, torch.tensor([[4, 5, 6]] * 3), torch.tensor([[4, 5, 6]] * 3))
    assert out.logits.shape == (3, 3, 16)  # three fed, four run (the bucket), three returned
    assert state.slots.num_slots == 4 + 4 and not bool(state.slots.live[:, -1].any())
    adapter.select_rows(state, torch.tensor([2]))
    assert state.cache.rows == 1 and state.cache.row_capacity == 4  # the buffer keeps its shape: no recompile


def test_bad_compile_settings_say_what_is_allowed(model):
    with pytest.raises(ValueError, match="compile backend must be one of"):
        LlamaGenAdapter(model, compile="no-such-backend")
    with pytest.raises(ValueError, match="compile mode must be one of"):
        LlamaGenAdapter(model, compile={"mode": "fastest"})
    with pytest.raises(ValueError, match="compile must be True, False"):
        LlamaGenAdapter(model, compile=3)
