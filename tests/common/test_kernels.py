"""Acceptance kernels: torch references vs Triton (interpreter on CPU), exact
greedy cases, and distributional checks of speculative sampling."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede any triton import

import pytest
import torch
from law import speculative_accept_residual_from_target
from scipy.stats import chisquare

from mmspec.common.kernels import (
    HAS_TRITON,
    greedy_accept,
    kernel_backend,
    sample_inverse_cdf,
    speculative_accept,
)

needs_triton = pytest.mark.skipif(
    not HAS_TRITON or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs triton with TRITON_INTERPRET=1 set before import",
)

ONE_MINUS_ULP = float(torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)))  # largest fp32 < 1


def _use_backend(monkeypatch, backend):
    monkeypatch.setenv("MMSPEC_KERNELS", backend)


def _assert_same(a, b):
    assert torch.equal(a[0], b[0]), (a[0], b[0])
    assert torch.equal(a[1], b[1]), (a[1], b[1])


# --------------------------------------------------------------------------
# kernel_backend
# --------------------------------------------------------------------------

def test_kernel_backend_rejects_bad_value(monkeypatch):
    monkeypatch.setenv("MMSPEC_KERNELS", "cuda-please")
    with pytest.raises(ValueError, match="MMSPEC_KERNELS"):
        kernel_backend(torch.device("cpu"))


def test_kernel_backend_choices(monkeypatch):
    monkeypatch.setenv("MMSPEC_KERNELS", "torch")
    assert kernel_backend("cpu") == "torch"
    monkeypatch.setenv("MMSPEC_KERNELS", "auto")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert kernel_backend("cpu") == "torch"
    monkeypatch.setenv("MMSPEC_KERNELS", "triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernel_backend("cpu")


@needs_triton
def test_kernel_backend_auto_uses_interpreter(monkeypatch):
    monkeypatch.delenv("MMSPEC_KERNELS", raising=False)
    assert kernel_backend("cpu") == "triton"


# --------------------------------------------------------------------------
# sample_inverse_cdf
# --------------------------------------------------------------------------

def test_sample_inverse_cdf_skips_zero_weights_at_edges():
    w = torch.tensor([0.0, 3.0, 0.0, 0.0, 1.0, 2.0, 0.0])  # unnormalised, zeros at both ends
    u = torch.tensor([0.0, 0.5, ONE_MINUS_ULP])
    out = sample_inverse_cdf(w.expand(3, -1), u)
    assert out.tolist() == [1, 4, 5]


def test_sample_inverse_cdf_distribution_and_support():
    gen = torch.Generator().manual_seed(1)
    w = torch.tensor([0.0, 0.5, 0.0, 2.0, 1.0, 0.0, 0.25, 0.0])
    n = 100_000
    u = torch.rand(n, generator=gen)
    out = sample_inverse_cdf(w.expand(n, -1), u)
    counts = torch.bincount(out, minlength=w.numel()).double()
    assert counts[w == 0].sum() == 0
    support = w > 0
    w = w.double()
    expected = w[support] / w.sum() * n
    assert chisquare(counts[support].numpy(), expected.numpy()).pvalue > 1e-3


def test_sample_inverse_cdf_batch_dims_and_shape_check():
    probs = torch.rand(2, 3, 5)
    u = torch.rand(2, 3)
    assert sample_inverse_cdf(probs, u).shape == (2, 3)
    with pytest.raises(ValueError, match="u must have shape"):
        sample_inverse_cdf(probs, torch.rand(3))


# --------------------------------------------------------------------------
# greedy_accept
# --------------------------------------------------------------------------

BACKENDS = ["torch", pytest.param("triton", marks=needs_triton)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_hand_cases(monkeypatch, backend):
    _use_backend(monkeypatch, backend)
    draft = torch.tensor([[1, 2, 3], [1, 2, 3], [5, 2, 3], [1, 2, 4]])
    target = torch.tensor([[1, 2, 3, 9], [1, 7, 3, 9], [4, 2, 3, 9], [1, 2, 3, 8]])
    n, tokens = greedy_accept(draft, target)
    assert n.tolist() == [3, 1, 0, 2]
    assert tokens.tolist() == [[1, 2, 3, 9], [1, 7, -1, -1], [4, -1, -1, -1], [1, 2, 3, -1]]
    assert n.dtype == tokens.dtype == torch.long


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_zero_drafts(monkeypatch, backend):
    _use_backend(monkeypatch, backend)
    n, tokens = greedy_accept(torch.empty(2, 0, dtype=torch.long), torch.tensor([[8], [9]]))
    assert n.tolist() == [0, 0]
    assert tokens.tolist() == [[8], [9]]


@needs_triton
@pytest.mark.parametrize("K", [0, 1, 4, 9])
def test_greedy_triton_matches_reference(monkeypatch, K):
    gen = torch.Generator().manual_seed(K)
    # A 3-token vocabulary makes every prefix length likely.
    draft = torch.randint(0, 3, (40, K), generator=gen)
    target = torch.randint(0, 3, (40, K + 1), generator=gen)
    target[0, :K] = draft[0]  # all accepted
    _use_backend(monkeypatch, "torch")
    expected = greedy_accept(draft, target)
    _use_backend(monkeypatch, "triton")
    _assert_same(greedy_accept(draft.int(), target.int()), expected)


def test_greedy_shape_errors():
    with pytest.raises(ValueError, match="target_argmax must have shape"):
        greedy_accept(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="draft_tokens must have shape"):
        greedy_accept(torch.zeros(3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))


# --------------------------------------------------------------------------
# speculative_accept: backend agreement
# --------------------------------------------------------------------------

def _speculative_inputs(B, K, V, seed):
    """Random inputs with rows forced into the interesting branches."""
    gen = torch.Generator().manual_seed(seed)
    draft = torch.randint(0, V, (B, K), generator=gen)
    draft_probs = torch.rand(B, K, V, generator=gen)
    target_probs = torch.rand(B, K + 1, V, generator=gen)
    uniforms = torch.rand(B, K, generator=gen)
    residual_uniform = torch.rand(B, generator=gen)
    if K > 0:
        # Row 0: p == q accepts every draft (u < 1), so the bonus path runs.
        target_probs[0, :K] = draft_probs[0]
        # Row 1: the first draft has zero target mass, so nothing is accepted.
        target_probs[1, 0, draft[1, 0]] = 0.0
        # Row 2: p = q / 2 rejects (u > 1/2) with an all-zero residual -> fall back to p.
        target_probs[2, :K] = 0.5 * draft_probs[2]
        uniforms[2] = 0.9
        # Rows 3-4: zero target mass must reject even when q == 0 or u == 0.
        draft_probs[3, 0, draft[3, 0]] = 0.0
        target_probs[3, 0, draft[3, 0]] = 0.0
        uniforms[4, 0] = 0.0
        target_probs[4, 0, draft[4, 0]] = 0.0
    return draft, draft_probs, target_probs, uniforms, residual_uniform


def _both_backends(monkeypatch, *args):
    _use_backend(monkeypatch, "torch")
    expected = speculative_accept(*args)
    _use_backend(monkeypatch, "triton")
    return expected, speculative_accept(*args)


@needs_triton
@pytest.mark.parametrize("V", [7, 300, 2500])
@pytest.mark.parametrize("K", [0, 1, 4])
def test_speculative_triton_matches_reference(monkeypatch, K, V):
    draft, draft_probs, target_probs, uniforms, residual_uniform = _speculative_inputs(6, K, V, seed=100 * K + V)
    expected, got = _both_backends(monkeypatch, draft, draft_probs, target_probs, uniforms, residual_uniform)
    _assert_same(got, expected)
    if K > 0:
        assert expected[0][0] == K
        assert expected[0][1:5].tolist() == [0, 0, 0, 0]


@needs_triton
@pytest.mark.parametrize("V", [7, 2500])
@pytest.mark.parametrize("K", [0, 1, 4])
def test_speculative_triton_matches_reference_deterministic_drafts(monkeypatch, K, V):
    draft, _, target_probs, uniforms, residual_uniform = _speculative_inputs(6, K, V, seed=7 + K + V)
    if K > 0:
        # Row 2: p one-hot-ish on the draft with p < u -> rejected, residual all zero.
        target_probs[2, 0] = 0.0
        target_probs[2, 0, draft[2, 0]] = 0.5
        target_probs[0, :K] = 1.0  # accept everything (u < 1)
    expected, got = _both_backends(monkeypatch, draft, None, target_probs, uniforms, residual_uniform)
    _assert_same(got, expected)
    if K > 0:
        assert expected[0][0] == K and expected[0][1] == 0
        assert expected[0][1:5].tolist() == [0, 0, 0, 0]
        assert expected[1][2, 0] == draft[2, 0]


@needs_triton
def test_speculative_triton_many_rows_small_vocab(monkeypatch):
    # Near-equal p and q over a tiny vocabulary exercise every accept length.
    gen = torch.Generator().manual_seed(3)
    B, K, V = 64, 3, 5
    draft = torch.randint(0, V, (B, K), generator=gen)
    draft_probs = torch.softmax(torch.randn(B, K, V, generator=gen), -1)
    target_probs = torch.softmax(torch.randn(B, K + 1, V, generator=gen) * 0.3, -1)
    target_probs[::7, :, 1] = 0.0  # top-k style exact zeros
    uniforms = torch.rand(B, K, generator=gen)
    residual_uniform = torch.rand(B, generator=gen)
    expected, got = _both_backends(monkeypatch, draft, draft_probs, target_probs, uniforms, residual_uniform)
    _assert_same(got, expected)
    assert set(expected[0].tolist()) == {0, 1, 2, 3}


@needs_triton
def test_speculative_half_precision_and_strided_inputs(monkeypatch):
    draft, draft_probs, target_probs, uniforms, residual_uniform = _speculative_inputs(5, 3, 40, seed=11)
    # Non-contiguous target view with the same logical values.
    strided_target = target_probs.transpose(0, 1).contiguous().transpose(0, 1)
    args = (draft, draft_probs.bfloat16(), strided_target.half(), uniforms, residual_uniform.double())
    expected, got = _both_backends(monkeypatch, *args)
    _assert_same(got, expected)


def test_speculative_shape_errors():
    draft, draft_probs, target_probs, uniforms, residual_uniform = _speculative_inputs(5, 2, 6, seed=0)
    with pytest.raises(ValueError, match="target_probs must have shape"):
        speculative_accept(draft, draft_probs, target_probs[:, :2], uniforms, residual_uniform)
    with pytest.raises(ValueError, match="draft_probs must be None or have shape"):
        speculative_accept(draft, draft_probs[..., :5], target_probs, uniforms, residual_uniform)
    with pytest.raises(ValueError, match="uniforms must have shape"):
        speculative_accept(draft, draft_probs, target_probs, uniforms[:, :1], residual_uniform)
    with pytest.raises(ValueError, match="residual_uniform must have shape"):
        speculative_accept(draft, draft_probs, target_probs, uniforms, residual_uniform[:1])
    with pytest.raises(ValueError, match="draft_tokens must be an integer"):
        speculative_accept(draft.float(), draft_probs, target_probs, uniforms, residual_uniform)


# --------------------------------------------------------------------------
# speculative_accept: the emitted token follows the target distribution
# --------------------------------------------------------------------------

P = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])
Q = torch.tensor([0.30, 0.25, 0.20, 0.10, 0.10, 0.05])
N_ROWS = 200_000


def _first_token_pvalue(accept_fn, draft_probs_given: bool, seed: int) -> float:
    gen = torch.Generator().manual_seed(seed)
    V = P.numel()
    if draft_probs_given:
        draft = sample_inverse_cdf(Q.expand(N_ROWS, V), torch.rand(N_ROWS, generator=gen))[:, None]
        draft_probs = Q.expand(N_ROWS, 1, V)
    else:
        draft = torch.full((N_ROWS, 1), 2)  # a fixed (greedy) draft token
        draft_probs = None
    target_probs = P.expand(N_ROWS, 2, V)
    uniforms = torch.rand(N_ROWS, 1, generator=gen)
    residual_uniform = torch.rand(N_ROWS, generator=gen)
    _, tokens = accept_fn(draft, draft_probs, target_probs, uniforms, residual_uniform)
    counts = torch.bincount(tokens[:, 0], minlength=V).double()
    expected = P.double() / P.double().sum() * N_ROWS
    return chisquare(counts.numpy(), expected.numpy()).pvalue


@pytest.mark.parametrize("draft_probs_given", [True, False])
def test_speculative_first_token_follows_target(monkeypatch, draft_probs_given):
    # 200k interpreted Triton programs would take minutes; the Triton path is
    # tied to this one by the exact-agreement tests above.
    _use_backend(monkeypatch, "torch")
    assert _first_token_pvalue(speculative_accept, draft_probs_given, seed=0) > 1e-3


@pytest.mark.parametrize("draft_probs_given", [True, False])
def test_wrong_residual_is_detected(draft_probs_given):
    assert _first_token_pvalue(speculative_accept_residual_from_target, draft_probs_given, seed=0) < 1e-6


# --------------------------------------------------------------------------
# Ragged chains: per-row lengths in one launch
# --------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("deterministic", [False, True])
def test_lengths_equal_running_each_row_alone(monkeypatch, backend, deterministic):
    """Row b with lengths[b] = L behaves exactly like a K = L call on that row alone (bonus from p[L])."""
    K, V = 5, 40
    draft, draft_probs, target_probs, uniforms, residual_uniform = _speculative_inputs(8, K, V, seed=11)
    draft_probs = None if deterministic else draft_probs
    target_probs[:, :K] = target_probs[:, :K] * 0.3 + 0.7 * (draft_probs if draft_probs is not None else
                                                               torch.nn.functional.one_hot(draft, V).float())
    lengths = torch.tensor([0, 1, 2, 3, 4, 5, 2, 5])
    _use_backend(monkeypatch, backend)
    num, tokens = speculative_accept(draft, draft_probs, target_probs, uniforms, residual_uniform, lengths)
    gnum, gtokens = greedy_accept(draft, target_probs.argmax(-1), lengths)
    for b, n in enumerate(lengths.tolist()):
        keep = list(range(n)) + [K]  # the row's drafts, then its bonus distribution moved to slot n
        probs = target_probs[b:b + 1, keep[:n]]
        row_target = torch.cat([probs, target_probs[b:b + 1, n:n + 1]], 1)
        one = speculative_accept(draft[b:b + 1, :n], None if draft_probs is None else draft_probs[b:b + 1, :n],
                                 row_target, uniforms[b:b + 1, :n], residual_uniform[b:b + 1])
        assert int(num[b]) == int(one[0][0]) <= n
        assert tokens[b, :n + 1].tolist() == one[1][0].tolist()
        assert (tokens[b, n + 1:] == -1).all()
        g = greedy_accept(draft[b:b + 1, :n], row_target.argmax(-1))
        assert int(gnum[b]) == int(g[0][0]) and gtokens[b, :n + 1].tolist() == g[1][0].tolist()
    assert len(set(num.tolist())) > 2  # the case is ragged for real


def test_lengths_are_checked():
    draft, draft_probs, target_probs, uniforms, residual_uniform = _speculative_inputs(6, 4, 10, seed=1)
    with pytest.raises(ValueError, match="lengths"):
        speculative_accept(draft, draft_probs, target_probs, uniforms, residual_uniform,
                           torch.tensor([1, 2, 5, 0, 0, 0]))
    with pytest.raises(ValueError, match="lengths"):
        greedy_accept(draft, target_probs.argmax(-1), torch.tensor([1, 2]))
