"""The logits pipeline (temperature, top-k, top-p), its validation, and per-row random draws."""

import math

import pytest
import torch

from mmspec.common.logits import LogitsPipeline, check_generators, draw_uniform


def kept(processed: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(processed)


def test_temperature_zero_is_greedy_one_hot():
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0))
    pipe = LogitsPipeline(temperature=0)
    assert pipe.greedy
    probs = pipe.probs(logits)
    assert probs.shape == logits.shape and probs.dtype == torch.float32
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 11).float())
    assert not LogitsPipeline(temperature=0.5).greedy


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, -3.0, 0.5]])
    assert torch.allclose(LogitsPipeline(temperature=2.0).process(logits), logits / 2)
    assert torch.allclose(LogitsPipeline(temperature=0.5).probs(logits), (logits / 0.5).softmax(-1))
    assert torch.equal(LogitsPipeline(temperature=1.0).process(logits), logits)


def test_process_returns_float32():
    logits = torch.randn(2, 7, dtype=torch.float16)
    assert LogitsPipeline().process(logits).dtype == torch.float32
    assert LogitsPipeline(top_k=3, top_p=0.9).probs(logits).dtype == torch.float32


@pytest.mark.parametrize("k", [1, 3, 7])
def test_top_k_keeps_exactly_k(k):
    gen = torch.Generator().manual_seed(k)
    logits = torch.randn(4, 2, 20, generator=gen)  # continuous: no ties
    processed = LogitsPipeline(top_k=k).process(logits)
    assert torch.equal(kept(processed).sum(-1), torch.full((4, 2), k))
    # The kept entries are the k largest, unchanged.
    top = logits.topk(k, dim=-1).indices
    assert kept(processed).gather(-1, top).all()
    assert torch.equal(processed.gather(-1, top), logits.gather(-1, top))
    probs = LogitsPipeline(top_k=k).probs(logits)
    assert torch.allclose(probs.sum(-1), torch.ones(4, 2))
    assert (probs[~kept(processed)] == 0).all()


def test_top_k_at_least_vocab_keeps_everything():
    logits = torch.randn(2, 5)
    assert torch.equal(LogitsPipeline(top_k=5).process(logits), logits)
    assert torch.equal(LogitsPipeline(top_k=50).process(logits), logits)


def test_top_k_after_temperature():
    logits = torch.tensor([[3.0, 1.0, 2.0, 0.0]])
    processed = LogitsPipeline(temperature=2.0, top_k=2).process(logits)
    assert processed[0, 0] == 1.5 and processed[0, 2] == 1.0
    assert torch.isinf(processed[0, 1]) and torch.isinf(processed[0, 3])


@pytest.mark.parametrize("top_p, expected", [
    # probs 0.5, 0.3, 0.15, 0.05: the prefix masses are 0.5, 0.8, 0.95, 1.0.
    (0.3, 1),
    (0.5, 1),  # 0.5 already reaches 0.5
    (0.51, 2),
    (0.8, 2),  # 0.5 + 0.3 reaches 0.8
    (0.81, 3),
    (0.96, 4),
    (1.0, 4),
])
def test_top_p_keeps_smallest_prefix_reaching_p(top_p, expected):
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    perm = torch.tensor([2, 0, 3, 1])  # not in sorted order
    logits = probs.log()[perm]
    processed = LogitsPipeline(top_p=top_p).process(logits)
    assert int(kept(processed).sum()) == expected
    # The kept tokens are the `expected` most likely ones.
    kept_probs = sorted(probs[perm][kept(processed)].tolist(), reverse=True)
    assert kept_probs == pytest.approx(probs[:expected].tolist())
    renorm = LogitsPipeline(top_p=top_p).probs(logits)
    assert renorm.sum().item() == pytest.approx(1.0)
    assert renorm[kept(processed)].tolist() == pytest.approx(
        (probs[perm][kept(processed)] / probs[:expected].sum()).tolist())


def test_top_p_first_token_always_stays():
    logits = torch.tensor([[0.0, 0.1, 0.2, 0.3], [5.0, -1.0, -2.0, -3.0]])
    processed = LogitsPipeline(top_p=1e-6).process(logits)
    assert kept(processed).sum(-1).tolist() == [1, 1]
    assert kept(processed)[0, 3] and kept(processed)[1, 0]


def test_top_p_rows_are_independent():
    logits = torch.stack([torch.tensor([0.5, 0.3, 0.15, 0.05]).log(), torch.zeros(4)])
    processed = LogitsPipeline(top_p=0.8).process(logits)
    assert kept(processed).sum(-1).tolist() == [2, 4]  # uniform row: 0.25 * 3 < 0.8


def test_top_k_and_top_p_together():
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    # top_k=3 leaves 0.4, 0.3, 0.2 -> renormalized 4/9, 3/9, 2/9; top_p 0.7 reaches at 7/9.
    processed = LogitsPipeline(top_k=3, top_p=0.7).process(probs.log())
    assert kept(processed).tolist() == [True, True, False, False]


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=-1), "temperature"),
    (dict(temperature="1"), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=2.0), "top_k"),
    (dict(top_p=0), "top_p"),
    (dict(top_p=-0.1), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(top_p="0.9"), "top_p"),
])
def test_bad_values_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LogitsPipeline(**kwargs)


def test_nan_temperature_raises():
    with pytest.raises(ValueError, match="temperature"):
        LogitsPipeline(temperature=float("nan"))


def test_good_edge_values_are_accepted():
    LogitsPipeline(temperature=0, top_k=1, top_p=1.0)
    LogitsPipeline(temperature=1e-3, top_p=1e-9)
    LogitsPipeline(temperature=0.7, top_k=None, top_p=None)


def test_check_generators():
    assert check_generators(None, 3) is None
    g = torch.Generator()
    assert check_generators(g, 3) is g
    gens = [torch.Generator() for _ in range(3)]
    assert check_generators(gens, 3) == gens
    assert check_generators(tuple(gens), 3) == gens
    with pytest.raises(ValueError, match="list of 3"):
        check_generators(gens[:2], 3)
    with pytest.raises(ValueError, match="list of 3"):
        check_generators(gens + [torch.Generator()], 3)
    with pytest.raises(ValueError, match="generator"):
        check_generators([g, g, 7], 3)
    with pytest.raises(TypeError, match="generator"):
        check_generators(1234, 3)


def test_draw_uniform_per_row_generators_match_solo_draws():
    seeds = [11, 12, 13]
    out = draw_uniform([torch.Generator().manual_seed(s) for s in seeds], 3, 5, "cpu")
    assert out.shape == (3, 5)
    for b, s in enumerate(seeds):
        solo = torch.rand(5, generator=torch.Generator().manual_seed(s))
        assert torch.equal(out[b], solo)
    # A row's draws do not depend on its neighbours.
    pair = draw_uniform([torch.Generator().manual_seed(13), torch.Generator().manual_seed(11)], 2, 5, "cpu")
    assert torch.equal(pair[0], out[2]) and torch.equal(pair[1], out[0])


def test_draw_uniform_single_generator_and_none():
    out = draw_uniform(torch.Generator().manual_seed(4), 2, 3, "cpu")
    assert torch.equal(out, torch.rand(2, 3, generator=torch.Generator().manual_seed(4)))
    none = draw_uniform(None, 4, 6, "cpu")
    assert none.shape == (4, 6)
    assert ((none >= 0) & (none < 1)).all()
    assert math.isfinite(float(none.sum()))
