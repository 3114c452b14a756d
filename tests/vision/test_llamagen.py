"""The LlamaGen-style GPT: LlamaGen key layout, 2-D RoPE, and its ARModel adapter through the core loop."""

import pytest
import torch

from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import CFGModel
from mmspec.vision.llamagen import LlamaGenAdapter, LlamaGenModel, load_llamagen_state_dict, rope_2d_tables

TINY = dict(dim=32, n_layer=2, n_head=4, multiple_of=8, num_classes=3, vocab_size=16, block_size=16)

# Parameter names of LlamaGen's GPT (autoregressive/models/gpt.py) for a 2-layer c2i model.
LLAMAGEN_KEYS = {"tok_embeddings.weight", "cls_embedding.embedding_table.weight", "norm.weight", "output.weight"} | {
    f"layers.{i}.{name}.weight" for i in range(2) for name in (
        "attention.wqkv", "attention.wo", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3",
        "attention_norm", "ffn_norm")}


def tiny(seed=0):
    torch.manual_seed(seed)
    return LlamaGenModel(**TINY).eval()


def test_state_dict_uses_llamagen_names():
    assert set(tiny().state_dict()) == LLAMAGEN_KEYS


def test_llamagen_checkpoint_maps_onto_the_model():
    source = tiny(seed=1)
    checkpoint = {"model": {**source.state_dict(), "freqs_cis": torch.zeros(17, 4, 2)}}
    target = tiny(seed=2)
    load_llamagen_state_dict(target, checkpoint)
    tokens = torch.tensor([[16 + 1, 3, 5, 7]])
    assert torch.equal(target(tokens), source(tokens))
    bad = dict(checkpoint["model"])
    bad.pop("norm.weight")
    with pytest.raises(ValueError, match="missing"):
        load_llamagen_state_dict(target, bad)


def test_rope_tables_rotate_rows_and_columns_and_zero_the_class_token():
    cos, sin = rope_2d_tables(grid=4, head_dim=8, base=10000.0, prefix=1)
    assert cos.shape == (17, 4)
    assert torch.equal(cos[0], torch.zeros(4)) and torch.equal(sin[0], torch.zeros(4))
    # Position of grid cell (r, c) is 1 + 4r + c; the first half follows r, the second c.
    assert torch.allclose(cos[1 + 4 * 2 + 1, :2], cos[1 + 4 * 2 + 3, :2])
    assert torch.allclose(cos[1 + 4 * 1 + 3, 2:], cos[1 + 4 * 2 + 3, 2:])


def test_adapter_greedy_matches_full_recompute():
    model = tiny()
    labels = torch.tensor([0, 2])
    prompt = model.class_token(labels)[:, None]
    out = SpeculativeDecoder(LlamaGenAdapter(model), logits=LogitsPipeline(temperature=0)).generate(
        prompt, max_new_tokens=16)
    seq = prompt
    with torch.no_grad():
        for _ in range(16):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out.sequences, seq[:, 1:])


def test_cfg_over_the_adapter():
    model = tiny()
    labels = torch.tensor([1])
    cond, uncond = model.class_token(labels), model.class_token(torch.tensor([model.null_class]))
    cfg = CFGModel(LlamaGenAdapter(model), guidance_scale=3.0)
    out = SpeculativeDecoder(cfg, logits=LogitsPipeline(temperature=0)).generate(
        cond[:, None], max_new_tokens=8, prefill_input=(torch.stack([cond, uncond]), None))
    seq_c, seq_u = cond[:, None], uncond[:, None]
    with torch.no_grad():
        for _ in range(8):
            c, u = model(seq_c)[:, -1], model(seq_u)[:, -1]
            nxt = (u + 3.0 * (c - u)).argmax(-1, keepdim=True)
            seq_c, seq_u = torch.cat([seq_c, nxt], 1), torch.cat([seq_u, nxt], 1)
    assert torch.equal(out.sequences, seq_c[:, 1:])


def test_bad_configs():
    with pytest.raises(ValueError, match="block_size"):
        LlamaGenModel(**{**TINY, "block_size": 15})
    with pytest.raises(ValueError, match="n_head"):
        LlamaGenModel(**{**TINY, "dim": 36, "n_head": 6})
    model = tiny()
    with pytest.raises(ValueError, match="position"):
        model(torch.tensor([[1]]), positions=torch.tensor([[17]]))
