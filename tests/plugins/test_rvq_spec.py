"""`rvq_spec`: lossless RVQ speculation of the depth decoder.

Greedy codes equal plain AR's (bundled TTS, a tiny random CSM against transformers' own depth-decoder
`generate`), the joint law of a frame's residual codes under top-k / top-p sampling equals the exact law by
enumeration (and planted biases fail the same test), the core's acceptance kernel at the depth decoder's
shapes, the offsets' training, and clear errors.
"""

import dataclasses
import itertools
import os
import warnings

import numpy as np
import pytest
import torch
from law import gof_pvalue
from run_example import run_example

from mmspec import load_plugin
from mmspec.common.accept import Acceptance, AcceptRule, GreedyMatch, SpeculativeSampling
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.kernels import assemble_tokens, sample_inverse_cdf
from mmspec.common.logits import LogitsPipeline, draw_uniform
from mmspec.common.plugin import DecodeRequest
from mmspec.common.structure import RVQFrames
from mmspec.plugins.rvq_spec import OffsetDrafter, RVQOffsets, RVQSpecPlugin
from mmspec.speech.tts_model import DepthDecoderAR, tiny_csm_config

TEXTS = ["a fool and his money are soon parted", "hello there", "we are what we repeatedly do"]
GREEDY = {"temperature": 0.0, "depth_temperature": 0.0}


def generators(n, offset=0):
    return [torch.Generator().manual_seed(offset + i) for i in range(n)]


@pytest.fixture(scope="module")
def bundled():
    pipe = load_plugin("ar", model="tts-tiny")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def speak(pipe, texts, batch_size, **settings):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pipe(texts, generator=generators(len(texts)), batch_size=batch_size, max_new_frames=20,
                    **settings)


# ------------------------------------------------------------------------------------------- greedy = AR
@pytest.mark.parametrize("config", [{}, {"offsets": "none", "num_draft_tokens": 6}, {"tree_branching": "3,1,1"}],
                         ids=["bundled-offsets", "head-ahead-6", "tree"])
def test_greedy_codes_and_audio_equal_plain_ar_batch_1_and_ragged_batch(bundled, config, torch_kernels):
    plugin = load_plugin("rvq_spec", pipeline=bundled, **config)
    reference = speak(bundled, TEXTS, 3, **GREEDY)
    for batch_size in (1, 3):
        out = speak(plugin, TEXTS, batch_size, **GREEDY)
        for ours, theirs in zip(out.codes, reference.codes):
            assert torch.equal(ours, theirs)
        for ours, theirs in zip(out.audios, reference.audios):
            np.testing.assert_allclose(ours, theirs, atol=1e-5)
    stats = out.stats
    # Drafts were really accepted, raggedly: some calls kept several codes, others none.
    committed = [k for k, n in enumerate(stats.accepted_hist) if n]
    assert 1 in committed and max(committed) >= 3
    assert stats.row_steps < 7 * stats.extra["frames"]  # fewer depth calls than plain AR's K−1 per frame
    assert reference.stats.row_steps == 7 * reference.stats.extra["frames"]


def test_sampling_batch_equals_one_by_one_and_seeds_repeat(bundled, torch_kernels):
    plugin = load_plugin("rvq_spec", pipeline=bundled)
    batch = speak(plugin, TEXTS, 3)
    again = speak(plugin, TEXTS, 2)
    for i, text in enumerate(TEXTS):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            alone = plugin(text, generator=generators(1, i)[0], max_new_frames=20)
        assert torch.equal(batch.codes[i], alone.codes[0])
        assert torch.equal(batch.codes[i], again.codes[i])


def _tiny_csm(codebook_size=64, num_codebooks=8, seed=0, **overrides):
    from transformers import CsmForConditionalGeneration

    torch.manual_seed(seed)
    config = tiny_csm_config(num_codebooks=num_codebooks, codebook_size=codebook_size, hidden_size=64,
                             num_layers=2, num_heads=2, intermediate_size=128, depth_hidden_size=64,
                             depth_layers=2, depth_heads=2, depth_intermediate_size=128, **overrides)
    return CsmForConditionalGeneration(config).eval()


def _random_offsets(num_codebooks, hidden, scale, per_level=False, seed=1):
    offsets = RVQOffsets(hidden_size=hidden, num_codebooks=num_codebooks, per_level=per_level)
    with torch.no_grad():
        offsets.offsets.copy_(torch.randn(offsets.offsets.shape, generator=torch.Generator().manual_seed(seed))
                              * scale)
    return offsets


def _frame_decoder(target, offsets, logits, num_draft_tokens=2, tree=None, rule=None, drafter=None):
    drafter = drafter or OffsetDrafter(target, offsets, num_draft_tokens=num_draft_tokens, tree=tree)
    rule = rule or (GreedyMatch() if logits.greedy else SpeculativeSampling())
    return SpeculativeDecoder(target, drafter, rule, logits, num_draft_tokens=0 if tree else num_draft_tokens,
                              pad_token_id=0)


def test_greedy_equals_transformers_depth_decoder_generate(torch_kernels):
    """A tiny random CSM: rvq_spec's greedy frame equals the HF depth decoder's own greedy generate."""
    model = _tiny_csm()
    depth = model.depth_decoder
    rows = 5
    hidden = torch.randn(rows, 64, generator=torch.Generator().manual_seed(3))
    cb0 = torch.randint(0, 64, (rows,), generator=torch.Generator().manual_seed(4))
    prompt = torch.stack([torch.zeros_like(cb0), cb0], 1)
    with torch.no_grad():
        theirs = depth.generate(input_ids=prompt, backbone_last_hidden_state=hidden, do_sample=False,
                                max_new_tokens=7, min_new_tokens=7, suppress_tokens=[64])[:, 2:]
    offsets = _random_offsets(8, 64, 0.5)
    for tree in (None, RVQSpecPlugin(tree_branching="2,1").tree):
        out = _frame_decoder(DepthDecoderAR(depth, hidden, 64), offsets, LogitsPipeline(0.0), tree=tree).generate(
            prompt, max_new_tokens=7)
        assert torch.equal(out.sequences, theirs)
    # And through the TTS pipeline over the same tiny CSM: rvq_spec's greedy speech is plain AR's.
    from mmspec.speech.codec import SpectralRVQCodec
    from mmspec.speech.text import CharTokenizer
    from mmspec.speech.tts_pipeline import TTSPipeline

    codec = SpectralRVQCodec(dim=32, ffn=64, fine_dim=16, encoder_blocks=2, decoder_blocks=2, fine_blocks=1,
                             codebook_size=64).eval()
    pipe = TTSPipeline(model, CharTokenizer(), codec)
    pipe.set_progress_bar_config(disable=True)
    plugin = load_plugin("rvq_spec", pipeline=pipe, offsets="none", num_draft_tokens=5)
    for ours, ar in zip(speak(plugin, TEXTS, 3, **GREEDY).codes, speak(pipe, TEXTS, 3, **GREEDY).codes):
        assert torch.equal(ours, ar)


def test_qwen3_omni_code_predictor_greedy_equals_its_own_generate(torch_kernels):
    """Qwen3-Omni's talker code predictor (Qwen3-TTS's shape), tiny and random: a verify chunk gives the
    step-by-step logits, and rvq_spec's greedy groups equal transformers' own greedy `generate`."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeTalkerCodePredictorModelForConditionalGeneration as CodePredictor)

    from mmspec.speech.qwen3_omni import Qwen3OmniCodePredictorAR, tiny_code_predictor_config

    torch.manual_seed(0)
    predictor = CodePredictor(tiny_code_predictor_config(num_code_groups=8, vocab_size=64, hidden_size=32)).eval()
    code0_table = torch.nn.Embedding(64, 32)  # the talker's embedding of code group 0
    rows = 4
    hidden = torch.randn(rows, 32, generator=torch.Generator().manual_seed(1))
    cb0 = torch.randint(0, 64, (rows,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        embeds = torch.cat([hidden[:, None], code0_table(cb0)[:, None]], 1)
        theirs = predictor.generate(inputs_embeds=embeds, max_new_tokens=7, do_sample=False)
    theirs = theirs[:, -7:]
    target = Qwen3OmniCodePredictorAR(predictor, hidden, code0_table)
    codes = torch.cat([cb0[:, None], theirs], 1)
    state, _ = target.prefill(torch.zeros(rows, 1, dtype=torch.long))
    chunk = target.forward(state, codes[:, :5], torch.arange(1, 6).expand(rows, -1)).logits
    state, _ = target.prefill(torch.zeros(rows, 1, dtype=torch.long))
    steps = [target.forward(state, codes[:, i:i + 1], torch.full((rows, 1), i + 1)).logits for i in range(5)]
    torch.testing.assert_close(chunk, torch.cat(steps, 1), rtol=1e-4, atol=1e-5)
    offsets = _random_offsets(8, 32, 0.5)
    prompt = torch.stack([torch.zeros_like(cb0), cb0], 1)
    for tree in (None, RVQSpecPlugin(tree_branching="2,1").tree):
        out = _frame_decoder(Qwen3OmniCodePredictorAR(predictor, hidden, code0_table), offsets, LogitsPipeline(0.0),
                             num_draft_tokens=3, tree=tree).generate(prompt, max_new_tokens=7)
        assert torch.equal(out.sequences, theirs)
        assert out.stats.row_steps <= 7 * rows


# ------------------------------------------------------------------------------------------- output law
LAW_LEVELS, LAW_CODES, LAW_DRAWS = 5, 4, 30_000  # 4 residual codes of 4 values: 256 outcomes


@pytest.fixture(scope="module")
def law_setup():
    """A tiny CSM depth decoder with sharpened heads (structure to get wrong), a fixed backbone state and
    level-0 code, and offsets large enough that drafts differ clearly from the target."""
    model = _tiny_csm(codebook_size=LAW_CODES, num_codebooks=LAW_LEVELS, seed=5)
    depth = model.depth_decoder
    with torch.no_grad():
        depth.codebooks_head.weight.mul_(4.0)
    hidden = torch.randn(1, 64, generator=torch.Generator().manual_seed(6))
    return depth, hidden, _random_offsets(LAW_LEVELS, 64, 0.6, per_level=True)


def exact_law(depth, hidden, logits: LogitsPipeline, cb0: int = 1) -> torch.Tensor:
    """[codes ** (levels−1)] the processed-target law of a frame's residual codes, by enumeration."""
    sequences = torch.tensor(list(itertools.product(range(LAW_CODES), repeat=LAW_LEVELS - 1)))
    n = len(sequences)
    target = DepthDecoderAR(depth, hidden.expand(n, -1), LAW_CODES)
    state, _ = target.prefill(torch.zeros(n, 1, dtype=torch.long))
    tokens = torch.cat([torch.full((n, 1), cb0), sequences[:, :-1]], 1)
    with torch.no_grad():
        out = target.forward(state, tokens, torch.arange(1, LAW_LEVELS).expand(n, -1))
    probs = logits.probs(out.logits)  # [n, K−1, V]
    return probs.gather(2, sequences[:, :, None]).squeeze(2).prod(1)


def draw_frames(depth, hidden, offsets, logits, seed, **decoder_kwargs) -> torch.Tensor:
    """[LAW_DRAWS] outcome index of each row's residual codes (first code most significant)."""
    target = DepthDecoderAR(depth, hidden.expand(LAW_DRAWS, -1), LAW_CODES)
    prompt = torch.tensor([[0, 1]]).expand(LAW_DRAWS, -1)
    out = _frame_decoder(target, offsets, logits, **decoder_kwargs).generate(
        prompt, max_new_tokens=LAW_LEVELS - 1, generator=torch.Generator().manual_seed(seed))
    assert bool((out.lengths == LAW_LEVELS - 1).all())
    weights = LAW_CODES ** torch.arange(LAW_LEVELS - 2, -1, -1)
    return (out.sequences * weights).sum(1), out.stats


def law_pvalue(outcomes, law) -> float:
    """Chi-square p-value of the drawn outcomes against the exact law; 0 when an outcome the law forbids (a
    code outside the top-k / top-p set) was drawn at all (the chi-square alone would pool it away)."""
    counts = torch.bincount(outcomes, minlength=LAW_CODES ** (LAW_LEVELS - 1))
    if int(counts[law == 0].sum()):
        return 0.0
    return gof_pvalue(counts, law)


SAMPLING = {"top-k 3, T 0.9": LogitsPipeline(0.9, 3, 1.0), "top-p 0.8, T 0.9": LogitsPipeline(0.9, None, 0.8),
            "top-k 3, top-p 0.9, T 1.2": LogitsPipeline(1.2, 3, 0.9)}


@pytest.mark.parametrize("name", list(SAMPLING))
def test_frame_law_equals_exact_law_under_truncated_sampling(law_setup, name, torch_kernels):
    depth, hidden, offsets = law_setup
    logits = SAMPLING[name]
    law = exact_law(depth, hidden, logits)
    outcomes, stats = draw_frames(depth, hidden, offsets, logits, seed=11)
    assert law_pvalue(outcomes, law) > 1e-3
    # Drafts were tested and the test had work to do: some accepted, some rejected (ragged).
    assert 0.1 < stats.acceptance_per_position[0] < 0.95


def test_tree_frame_law_equals_exact_law(law_setup, torch_kernels):
    depth, hidden, offsets = law_setup
    logits = SAMPLING["top-k 3, T 0.9"]
    outcomes, _ = draw_frames(depth, hidden, offsets, logits, seed=12, tree=RVQSpecPlugin(tree_branching="2,1").tree)
    assert law_pvalue(outcomes, exact_law(depth, hidden, logits)) > 1e-3


class AcceptAllDrafts(AcceptRule):
    """Planted bug: keep every draft a row has (its ragged length), then a target sample."""

    def __call__(self, draft, target_probs, generator=None):
        batch = draft.tokens.shape[0]
        num = draft.lengths if draft.lengths is not None else torch.full((batch,), draft.num_tokens)
        u = draw_uniform(generator, batch, 1, target_probs.device)[:, 0]
        bonus = sample_inverse_cdf(target_probs[torch.arange(batch), num], u)
        return Acceptance(num, assemble_tokens(draft.tokens, num, bonus))


class UntruncatedTargetDrafter(OffsetDrafter):
    """With a decoder whose logits pipeline has no top-k: drafts are still top-k truncated, but the test and
    the residual use the untruncated target (the verifier forgot the deployed top-k)."""

    def __init__(self, *args, drafting: LogitsPipeline, **kwargs):
        super().__init__(*args, **kwargs)
        self.drafting = drafting

    def propose(self, ctx):
        return super().propose(dataclasses.replace(ctx, logits=self.drafting))


def test_planted_biases_fail_the_law_test(law_setup, torch_kernels):
    depth, hidden, offsets = law_setup
    logits = SAMPLING["top-k 3, T 0.9"]
    law = exact_law(depth, hidden, logits)
    outcomes, _ = draw_frames(depth, hidden, offsets, logits, seed=13, rule=AcceptAllDrafts())
    assert law_pvalue(outcomes, law) < 1e-6
    target = DepthDecoderAR(depth, hidden.expand(LAW_DRAWS, -1), LAW_CODES)
    untruncated = LogitsPipeline(0.9, None, 1.0)
    drafter = UntruncatedTargetDrafter(target, offsets, num_draft_tokens=2, drafting=logits)
    outcomes, _ = draw_frames(depth, hidden, offsets, untruncated, seed=14, drafter=drafter)
    assert law_pvalue(outcomes, law) < 1e-6
    # ... while the untruncated law itself is what that decoder follows (the test is not just strict).
    assert law_pvalue(outcomes, exact_law(depth, hidden, untruncated)) > 1e-3


# ----------------------------------------------------------------------------------------------- kernel
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")
def test_core_acceptance_kernel_at_depth_decoder_shapes(monkeypatch):
    """rvq_spec accepts with the core's speculative_accept: Triton equals the torch reference on top-k-50
    processed distributions over 1025 ids (1024 codes + the masked end of speech), ragged draft lengths."""
    from mmspec.common.kernels import HAS_TRITON, speculative_accept

    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    gen = torch.Generator().manual_seed(0)
    batch, k, vocab = 8, 6, 1025
    logits = LogitsPipeline(0.9, 50, 1.0)
    raw = torch.randn(batch, k + 1, vocab, generator=gen) * 3
    raw[..., 1024:] = float("-inf")
    target = logits.probs(raw)
    draft_probs = logits.probs(raw[:, :k] + torch.randn(batch, k, vocab, generator=gen))
    draft = sample_inverse_cdf(draft_probs.reshape(-1, vocab), torch.rand(batch * k, generator=gen)).view(batch, k)
    lengths = torch.tensor([6, 5, 4, 3, 2, 1, 0, 6])
    uniforms, residual = torch.rand(batch, k, generator=gen), torch.rand(batch, generator=gen)
    monkeypatch.setenv("MMSPEC_KERNELS", "torch")
    expected = speculative_accept(draft, draft_probs, target, uniforms, residual, lengths)
    monkeypatch.setenv("MMSPEC_KERNELS", "triton")
    got = speculative_accept(draft, draft_probs, target, uniforms, residual, lengths)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert bool((expected[0] <= lengths).all()) and len(set(expected[0].tolist())) > 2
    kept = got[1][torch.arange(batch), got[0]]
    assert bool((target[torch.arange(batch), got[0], kept] > 0).all())  # never a code outside the top-k


# ----------------------------------------------------------------------------------------------- errors
def test_bad_settings_are_refused_at_load_time(bundled, tmp_path):
    with pytest.raises(ValueError, match="num_draft_tokens"):
        load_plugin("rvq_spec", pipeline=bundled, num_draft_tokens=0)
    with pytest.raises(ValueError, match=r"must be in 1\.\.6 for RVQFrames\(depth 8\).*got 7"):
        load_plugin("rvq_spec", pipeline=bundled, num_draft_tokens=7)
    with pytest.raises(ValueError, match=r"depth of RVQSpecConfig.tree_branching must be in 1\.\.6"):
        load_plugin("rvq_spec", pipeline=bundled, tree_branching="2,1,1,1,1,1,1")
    RVQOffsets(hidden_size=64, num_codebooks=8).save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="trained for a depth decoder of 8 code levels and hidden size 64; this "
                                         "one has 8 levels and hidden size 256"):
        load_plugin("rvq_spec", pipeline=bundled, offsets=str(tmp_path / "other"))
    RVQOffsets(hidden_size=256, num_codebooks=4).save_pretrained(tmp_path / "shallow")
    with pytest.raises(ValueError, match="4 code levels"):
        load_plugin("rvq_spec", pipeline=bundled, offsets=str(tmp_path / "shallow"))
    with pytest.raises(ValueError, match="not a saved head folder"):
        load_plugin("rvq_spec", pipeline=bundled, offsets=str(tmp_path / "nope"))


def test_a_pipeline_without_a_depth_decoder_is_refused():
    with pytest.raises(ValueError, match="'rvq_spec' decodes RVQFrames tokens; ASRPipeline offers"):
        load_plugin("rvq_spec", model="asr-tiny")  # speech, but no depth decoder
    with pytest.raises(ValueError, match="'rvq_spec' decodes RVQFrames tokens; ARImagePipeline offers"):
        load_plugin("rvq_spec", pipeline=load_plugin("ar", model="llamagen-tiny"))
    plugin = RVQSpecPlugin(offsets="none")
    request = DecodeRequest(target=object(), logits=LogitsPipeline(0.0), structure=RVQFrames(8, 64))
    with pytest.raises(TypeError, match="not an RVQDepthModel"):
        plugin.build_decoder(None, request)
    with pytest.raises(ValueError, match="needs at least 3 code levels"):
        plugin.check_structure(RVQFrames(2, 64))


def test_save_and_reload_keeps_the_offsets(bundled, tmp_path, torch_kernels):
    plugin = load_plugin("rvq_spec", pipeline=bundled, num_draft_tokens=3)
    plugin.save_pretrained(tmp_path / "saved")
    from mmspec.speech.tts_pipeline import TTSPipeline

    again = TTSPipeline.from_pretrained(tmp_path / "saved")
    again.set_progress_bar_config(disable=True)
    assert again.plugin.name == "rvq_spec" and again.plugin.config.num_draft_tokens == 3
    assert torch.equal(again.plugin.offsets_module().offsets, plugin.plugin.offsets_module().offsets)
    assert all(torch.equal(a, b) for a, b in zip(speak(again, TEXTS[:2], 2).codes, speak(plugin, TEXTS[:2], 2).codes))


# --------------------------------------------------------------------------------------------- training
@pytest.mark.train
def test_offset_training_lowers_the_loss_and_resumes_to_the_same_offsets(tmp_path, capsys):
    common = ["--num-texts", "4", "--num-validation", "2", "--max-frames", "30", "--steps", "40",
              "--batch-frames", "32", "--checkpoint-every", "20"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run_example("train_rvq_offsets.py", common + ["--work-dir", whole, "--out", whole / "out"])
    log = capsys.readouterr().out
    run_example("train_rvq_offsets.py", common + ["--work-dir", parts, "--out", parts / "out", "--stop-after", "20"])
    run_example("train_rvq_offsets.py", common + ["--work-dir", parts, "--out", parts / "out"])
    assert "resumed at step 20" in capsys.readouterr().out
    a = RVQOffsets.from_pretrained(whole / "out").offsets
    b = RVQOffsets.from_pretrained(parts / "out").offsets
    assert torch.equal(a, b) and float(a.detach().abs().sum()) > 0
    before = float(log.split("head-ahead): kl ")[1].split()[0])
    after = float(log.split("learned offsets: kl ")[1].split()[0])
    assert after < before


# ------------------------------------------------------------------------------------------------ bench
def test_code_histogram_comparison_sees_a_biased_level_and_not_a_resample(bundled):
    """The bench's lossless evidence under sampling: per-level code-histogram distance against a permutation
    null. Two sample sets of the same law sit inside the null; a shifted level does not."""
    gen = torch.Generator().manual_seed(0)
    def texts(n):
        return [torch.randint(0, 40, (30 * 8,), generator=gen).tolist() for _ in range(n)]
    same = bundled.bench_compare([None] * 12, texts(12), texts(12))
    assert min(same["code_tv_pvalue_per_level"]) > 0.01
    biased = texts(12)
    for sequence in biased:
        for i in range(3, len(sequence), 8):  # level 3 of every frame moves to codes 20..59
            sequence[i] += 20
    shifted = bundled.bench_compare([None] * 12, texts(12), biased)
    assert shifted["code_tv_pvalue_per_level"][3] < 0.01 and shifted["code_tv_per_level"][3] > 0.3
    assert max(shifted["code_tv_pvalue_per_level"][:3]) > 0.01


def test_bench_row_reports_codes_per_call_and_the_rvq_table(torch_kernels):
    from mmspec.common.bench import run_bench
    from mmspec.speech.bench import rvq_table

    row = run_bench("rvq_spec", num_samples=2, settings={"max_new_frames": 15}, progress=lambda *_: None)
    base, acc = row["baseline"], row["accelerated"]
    assert base["depth_calls_per_frame"] == 7 and acc["depth_calls_per_frame"] < 7
    assert acc["mean_accepted"] > 1 and row["step_compression"] > 1
    assert len(row["comparison"]["code_tv_per_level"]) == 8 and row["exact_match_rate"] is None
    table = rvq_table([row])
    assert table.count("\n") == 2 and "| rvq_spec | defaults | 1 | 2 |" in table
