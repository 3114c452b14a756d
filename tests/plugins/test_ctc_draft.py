"""ctc_draft: kernels vs references, strict == plain AR (planted and real drafts, ragged batches), the relaxed
rule, the gate, KV reuse after a partial accept, sampling law, the Whisper/Wav2Vec2 pair, bad inputs."""

import math

import pytest
import torch

from law import gof_pvalue, sequence_codes
from mmspec import load_plugin
from mmspec.common.accept import Acceptance, AcceptRule
from mmspec.common.logits import LogitsPipeline
from mmspec.plugins.ctc_draft import CTCDraftPlugin, ctc_hypotheses
from mmspec.plugins.ctc_draft.kernels import (ctc_greedy, ctc_greedy_reference, floor_accept,
                                              floor_accept_reference, frame_entropy)
from mmspec.speech.data import load_test_set
from mmspec.speech.hf import tiny_random_recognizer
from mmspec.speech.pipeline import ASRPipeline, load_audio, pad_waves
from mmspec.speech.recognizer import BundledRecognizer
from tiny_models import tiny_asr_model

EOS = 2


# ------------------------------------------------------------------------------------------------ kernels
@pytest.mark.parametrize("seed", range(4))
def test_ctc_greedy_kernel_matches_reference(seed):
    g = torch.Generator().manual_seed(seed)
    batch, frames, vocab = 5, 23, 9
    logits = torch.randn(batch, frames, vocab, generator=g) * 3
    logits[1, :, 0] += 5  # a mostly-blank row
    logits[2] = logits[2, :1].expand(frames, -1)  # one repeated symbol: collapses to one token (or none)
    lengths = torch.tensor([23, 17, 23, 0, 1])
    got, want = ctc_greedy(logits, lengths, blank=0), ctc_greedy_reference(logits, lengths, 0)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-5, atol=1e-5)


def test_ctc_greedy_collapses_by_hand():
    ids = [[0, 3, 3, 0, 3, 4, 4, 0, 0, 5]]  # blank, a a, blank, a, b b, blank blank, c
    logits = torch.nn.functional.one_hot(torch.tensor(ids), 6).float() * 20
    tokens, counts, max_h, mean_h = ctc_greedy(logits, torch.tensor([10]), blank=0)
    assert counts.tolist() == [4] and tokens[0, :4].tolist() == [3, 3, 4, 5]
    assert (tokens[0, 4:] == -1).all()
    torch.testing.assert_close(max_h, frame_entropy(logits[0]).max()[None])
    # Padding frames never enter the statistics: a padded copy gets the same gate values.
    padded = torch.cat([logits, torch.zeros(1, 5, 6)], 1)
    _, _, max_p, mean_p = ctc_greedy(padded, torch.tensor([10]), blank=0)
    torch.testing.assert_close((max_p, mean_p), (max_h, mean_h))


@pytest.mark.parametrize("seed", range(4))
def test_floor_accept_kernel_matches_reference(seed):
    g = torch.Generator().manual_seed(seed)
    batch, k, vocab = 6, 7, 5
    drafts = torch.randint(0, vocab, (batch, k), generator=g)
    probs = (torch.randn(batch, k + 1, vocab, generator=g) * 2).softmax(-1)
    lengths = torch.tensor([7, 0, 3, 7, 1, 5])
    for floor in (0.0, 0.2, 0.5, 1.0):
        got, want = floor_accept(drafts, probs, floor, lengths), floor_accept_reference(drafts, probs, floor, lengths)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # No drafts at all (the AR steps after a partial accept): the argmax is the next token.
    empty = torch.empty(batch, 0, dtype=torch.long)
    for fn in (floor_accept, lambda d, p, f, n: floor_accept_reference(d, p, f, n)):
        num, tokens = fn(empty, probs[:, :1], 0.5, torch.zeros(batch, dtype=torch.long))
        assert num.tolist() == [0] * batch and torch.equal(tokens[:, 0], probs[:, 0].argmax(-1))


def test_floor_accept_by_hand():
    probs = torch.tensor([[[0.1, 0.6, 0.3], [0.5, 0.25, 0.25], [0.2, 0.2, 0.6], [1.0, 0.0, 0.0]]])
    drafts = torch.tensor([[2, 1, 0]])  # p = 0.3 (not argmax), 0.25, 0.2
    num, tokens = floor_accept(drafts, probs, 0.25)
    assert num.tolist() == [2] and tokens.tolist() == [[2, 1, 2, -1]]  # third fails: argmax 2 follows
    num, tokens = floor_accept(drafts, probs, 0.9)  # nothing reaches 0.9 and the first is not the argmax
    assert num.tolist() == [0] and tokens.tolist() == [[1, -1, -1, -1]]
    num, tokens = floor_accept(torch.tensor([[1, 0, 2]]), probs, 0.99)  # argmax matches are kept at any floor
    assert num.tolist() == [3] and tokens.tolist() == [[1, 0, 2, 0]]
    with pytest.raises(ValueError, match="floor"):
        floor_accept(drafts, probs, 1.5)


# ------------------------------------------------------------------------------------------------ models
class PlantedCTC:
    """Wraps a recognizer: its CTC head is replaced by one-hot frames spelling given hypotheses."""

    def __init__(self, inner, hypotheses, confidence=20.0):
        self.inner, self.hypotheses, self.confidence = inner, hypotheses, confidence

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def encode(self, waves, num_samples):
        encoded = self.inner.encode(waves, num_samples)
        vocab = encoded.ctc_logits.shape[-1]
        frames = 2 * max(len(h) for h in self.hypotheses) + 1
        ids = torch.full((len(self.hypotheses), frames), self.inner.ctc_blank_id)
        for b, h in enumerate(self.hypotheses):
            ids[b, 1:2 * len(h):2] = torch.tensor(h, dtype=torch.long)  # blank between every symbol
        encoded.ctc_logits = torch.nn.functional.one_hot(ids, vocab).float() * self.confidence
        encoded.ctc_lengths = torch.tensor([2 * len(h) + 1 for h in self.hypotheses])
        return encoded


@pytest.fixture(scope="module")
def audio():
    return [load_audio(row["audio"]) for row in load_test_set()[:4]]


# End-to-end tests below run the torch references of the kernels (tested against Triton above) except the
# planted ragged-batch test, which runs the whole plugin on the Triton kernels under the interpreter.
def run(recognizer, audio, plugin=None, batch_size=4, max_new_tokens=24, **call):
    pipe = ASRPipeline(recognizer)
    if plugin is not None:
        pipe = load_plugin("ctc_draft", pipeline=pipe, **plugin)
    return pipe(audio, sampling_rate=16000, batch_size=batch_size, max_new_tokens=max_new_tokens, **call)


def corrupted(seq, position, vocab=31):
    out = list(seq)
    out[position] = 3 + (out[position] - 3 + 1) % (vocab - 3)
    return out


def test_strict_equals_ar_with_planted_drafts_ragged_batch(audio):
    recognizer = BundledRecognizer(tiny_asr_model(sharpen=8.0))
    ar = run(recognizer, audio)
    texts = [s[:-1] if s[-1] == EOS else s for s in ar.sequences]
    assert all(len(t) >= 6 for t in texts), "the tiny decoder should write a few characters"
    planted = [texts[0],  # the AR output itself: accepted whole, EOS included
               corrupted(texts[1], 3),  # wrong 4th token: 3 kept, the decoder corrects, AR resumes
               texts[2][:2],  # too short: the decoder goes on after the draft's EOS is rejected
               texts[3] + [5, 6, 7]]  # too long: the draft's tail is rejected
    out = run(PlantedCTC(recognizer, planted), audio, {"mode": "strict"})
    assert out.sequences == ar.sequences
    assert out.texts == ar.texts
    # Row 0 needs one decoder pass; the others resume AR from their kept prefix on the verify pass's cache.
    one = run(PlantedCTC(recognizer, planted[:1]), audio[:1], {"mode": "strict"})
    assert one.stats.target_nfe == 1 and one.sequences == ar.sequences[:1]
    two = run(PlantedCTC(recognizer, planted[1:2]), audio[1:2], {"mode": "strict", "resync": False})
    assert two.stats.target_nfe == 1 + len(ar.sequences[1]) - 4  # verify, then one forward per token after
    # Batch 1 gives the same as the ragged batch.
    singles = [run(PlantedCTC(recognizer, [h]), [a], {"mode": "strict"}).sequences[0] for h, a in zip(planted, audio)]
    assert singles == ar.sequences


def test_continuous_batching_gives_the_transcripts_of_plain_batches(audio, torch_kernels):
    """max_batch_size: utterances join the running decode as others finish. AR and every ctc_draft mode give
    what plain batches give, with planted drafts of mixed quality (rows finish at different steps) and with
    the encoder run one utterance at a time (its outputs joined, padded to the longest)."""
    recognizer = BundledRecognizer(tiny_asr_model(sharpen=8.0))
    ar = run(recognizer, audio)
    refilled = run(recognizer, audio, max_batch_size=2)
    assert refilled.sequences == ar.sequences and refilled.stats.extra["admitted_rows"] == 2
    assert refilled.stats.target_nfe < ar.stats.target_nfe * 2  # two rows at a time, not one
    texts = [s[:-1] if s[-1] == EOS else s for s in ar.sequences]
    # Admitted rows draft their own hypotheses: each row verifies in as many passes as in a plain batch.
    right = run(PlantedCTC(recognizer, texts), audio, {"mode": "strict"}, max_batch_size=2)
    assert right.sequences == ar.sequences
    assert right.stats.row_forwards == run(PlantedCTC(recognizer, texts), audio, {"mode": "strict"}).stats.row_forwards
    planted = [corrupted(texts[0], 2), texts[1], texts[2][:2], texts[3] + [5, 6]]
    for plugin in ({"mode": "strict"}, {"mode": "strict", "resync": False}, {"mode": "relaxed", "tau": None},
                   {"mode": "strict", "redraft_tokens": 2, "backoff": False},
                   {"mode": "strict", "refill_admit_fraction": 0.0}):  # admitted one by one, at once
        batches = run(PlantedCTC(recognizer, planted), audio, plugin)
        refilled = run(PlantedCTC(recognizer, planted), audio, plugin, max_batch_size=2)
        assert refilled.sequences == batches.sequences, plugin
        assert refilled.stats.extra["admitted_rows"] == 2
        if plugin["mode"] == "strict":
            assert refilled.sequences == ar.sequences
    own = run(recognizer, audio, {"mode": "strict"}, batch_size=1, max_batch_size=3)
    assert own.sequences == ar.sequences and own.stats.extra["admitted_rows"] == 1
    with pytest.warns(UserWarning, match="no speech found"):  # silent inputs: no utterance to encode or decode
        assert run(recognizer, [torch.zeros(16000)] * 3, {"mode": "strict"}, max_batch_size=2).texts == [""] * 3
    with pytest.raises(ValueError, match="max_batch_size must be an int >= 1"):
        run(recognizer, audio, max_batch_size=0)
    whisper = ASRPipeline(tiny_random_recognizer())
    assert "join" in whisper.continuous_batching_blocker()
    with pytest.raises(ValueError, match="max_batch_size needs continuous batching"):
        whisper(audio, sampling_rate=16000, max_batch_size=2)


def test_strict_equals_ar_with_the_models_own_ctc(audio, torch_kernels):
    recognizer = BundledRecognizer(tiny_asr_model(seed=3, sharpen=8.0))
    ar = run(recognizer, audio)
    for batch_size in (1, 3):
        assert run(recognizer, audio, {"mode": "strict"}, batch_size=batch_size).sequences == ar.sequences


def test_relaxed_rule_floors(audio, torch_kernels):
    recognizer = BundledRecognizer(tiny_asr_model(sharpen=8.0))
    planted = [[3, 4, 5, 6], [7, 8], [9], [10, 11, 12, 13, 14]]
    strict = run(PlantedCTC(recognizer, planted), audio, {"mode": "strict"})
    # floor 1: only argmax matches pass (as strict), gate off.
    same = run(PlantedCTC(recognizer, planted), audio, {"mode": "relaxed", "floor": 1.0, "tau": None})
    assert same.sequences == strict.sequences
    # floor 0: every draft token passes, end-of-text included: the output is the CTC hypothesis.
    everything = run(PlantedCTC(recognizer, planted), audio, {"mode": "relaxed", "floor": 0.0, "tau": None})
    assert everything.sequences == [h + [EOS] for h in planted]
    assert everything.stats.target_nfe == 1
    # In between, more floor means fewer kept tokens.
    kept = [run(PlantedCTC(recognizer, planted), audio, {"mode": "relaxed", "floor": f, "tau": None}).stats
            for f in (0.0, 0.05, 0.3, 1.0)]
    nfe = [s.nfe_per_sample for s in kept]
    assert nfe == sorted(nfe)


def test_gate_takes_confident_ctc_and_skips_the_decoder(audio, torch_kernels):
    recognizer = BundledRecognizer(tiny_asr_model())
    planted = [[3, 4, 5], [6, 7], [], [8]]
    confident = PlantedCTC(recognizer, planted, confidence=30.0)  # frame entropy ~ 1e-11 nats
    out = run(confident, audio, {"mode": "relaxed", "tau": 0.01})
    assert out.stats.extra["gated_rows"] == 3  # the empty hypothesis is never final
    assert [out.sequences[i] for i in (0, 1, 3)] == [[3, 4, 5, EOS], [6, 7, EOS], [8, EOS]]
    assert out.sequences[2] == run(recognizer, audio[2:3]).sequences[0]  # decoded as plain AR (floor aside)
    unsure = PlantedCTC(recognizer, planted, confidence=2.0)
    assert run(unsure, audio, {"mode": "relaxed", "tau": 0.01}).stats.extra["gated_rows"] == 0
    mean_gate = run(unsure, audio, {"mode": "relaxed", "tau": 0.5, "gate": "mean"}).stats.extra["gated_rows"]
    max_gate = run(unsure, audio, {"mode": "relaxed", "tau": 0.5, "gate": "max"}).stats.extra["gated_rows"]
    assert mean_gate >= max_gate
    ctc_only = run(unsure, audio, {"mode": "ctc"})
    assert ctc_only.stats.target_nfe == 0 and ctc_only.sequences[0] == [3, 4, 5, EOS]


def test_lossless_flag_follows_mode_and_gate():
    assert CTCDraftPlugin().lossless
    assert not CTCDraftPlugin(tau=1.0).lossless
    assert not CTCDraftPlugin(mode="relaxed").lossless and CTCDraftPlugin(mode="relaxed").tau == 1.0
    assert not CTCDraftPlugin(mode="ctc").lossless


class AcceptEverything(AcceptRule):
    """A planted bug: keeps every draft token under sampling (ignores p entirely)."""

    name = "accept_everything"

    def __call__(self, draft, target_probs, generator=None):
        k = draft.tokens.shape[1]
        extra = target_probs[torch.arange(k)[None] * 0 + torch.arange(draft.tokens.shape[0])[:, None], k].argmax(-1)
        return Acceptance(torch.full_like(extra[:, 0], k), torch.cat([draft.tokens, extra[:, :1]], 1))


@torch.no_grad()
def exact_law(recognizer, encoded_row, new_tokens, vocab):
    import itertools

    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=new_tokens)))
    rows = torch.zeros(len(seqs), dtype=torch.long)
    target = recognizer.decoder(encoded_row, rows)
    ids = torch.cat([torch.full((len(seqs), 1), 1), seqs], 1)
    state, out = target.prefill(ids)
    logp = out.logits[:, :-1].log_softmax(-1).gather(2, seqs[..., None]).squeeze(-1).sum(1)
    return logp.exp()


def test_strict_sampling_follows_the_decoder_law(audio, torch_kernels):
    """Temperature 1: drafts verified by speculative sampling keep the decoder's law (chi-square, 20 000)."""
    model = tiny_asr_model(seed=5, sharpen=6.0)
    model.lm_head.bias.data[8:] -= 30.0  # five live characters (3..7) + EOS keep the law enumerable
    recognizer = BundledRecognizer(model)
    wave, n = pad_waves(audio[:1])
    encoded = recognizer.encode(wave, n)
    law = exact_law(recognizer, encoded, 2, 31)
    samples = 20000
    ar_first = law.view(31, 31).sum(1).argmax()
    hyp = [int(ar_first), 4]  # a likely first token, then a plausible one
    from mmspec.common.decoder import SpeculativeDecoder
    from mmspec.plugins.ctc_draft import CTCHypothesisDrafter, OneHotDraftSampling

    def sample(rule):
        rows = torch.zeros(samples, dtype=torch.long)
        target = recognizer.decoder(encoded, rows)
        drafter = CTCHypothesisDrafter([hyp + [EOS]] * samples, pad_id=EOS)
        decoder = SpeculativeDecoder(target, drafter, rule, LogitsPipeline(temperature=1.0), num_draft_tokens=3,
                                     eos_token_id=None)
        out = decoder.generate(torch.ones(samples, 1, dtype=torch.long), max_new_tokens=2,
                               generator=torch.Generator().manual_seed(0))
        counts = torch.bincount(sequence_codes(out.sequences, 31), minlength=31 ** 2)
        return gof_pvalue(counts, law), out.stats

    p_value, stats = sample(OneHotDraftSampling())
    assert stats.acceptance_per_position[0] > 0.2  # the draft is often kept: the test exercises acceptance
    assert p_value > 1e-3
    biased, _ = sample(AcceptEverything())
    assert biased < 1e-6


def test_strict_sampling_through_the_pipeline_is_seeded(audio, torch_kernels):
    recognizer = BundledRecognizer(tiny_asr_model(sharpen=3.0))
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(4)]  # noqa: E731
    a = run(recognizer, audio, {"mode": "strict"}, temperature=1.0, generator=gens())
    b = run(recognizer, audio, {"mode": "strict"}, temperature=1.0, generator=gens(), batch_size=1)
    assert a.sequences == b.sequences
    with pytest.raises(ValueError, match="temperature=0"):
        run(recognizer, audio, {"mode": "relaxed", "tau": None}, temperature=1.0)


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="tau"):
        CTCDraftPlugin(tau=-0.1)
    with pytest.raises(ValueError, match="mode"):
        CTCDraftPlugin(mode="fast")
    with pytest.raises(ValueError, match="floor"):
        CTCDraftPlugin(floor=1.5)
    with pytest.raises(ValueError, match="gate"):
        CTCDraftPlugin(gate="median")
    with pytest.raises(ValueError, match="decodes CTCTranscript tokens; TextPipeline offers TokenSequence"):
        from mmspec.text.pipeline import TextPipeline
        from tiny_models import tiny_llama

        load_plugin("ctc_draft", pipeline=TextPipeline(tiny_llama()))


# ------------------------------------------------------------------------------------------ HF adapters
def test_whisper_wav2vec2_pair_strict_equals_ar(audio, torch_kernels):
    recognizer = tiny_random_recognizer()
    with torch.no_grad():  # steer the random decoder to characters so drafts can match
        bias = torch.full((40,), -1e4)
        bias[:28] = 0.0
        head = torch.nn.Linear(32, 40)
        head.weight.copy_(recognizer.whisper.proj_out.weight)
        head.bias.copy_(bias)
        recognizer.whisper.proj_out = head
    ar = run(recognizer, audio[:3], max_new_tokens=12)
    assert all(len(s) == 12 and max(s) < 28 for s in ar.sequences)  # characters only, to the length limit
    # Plant Wav2Vec2 CTC output spelling the AR text, partly wrong: re-tokenized, verified, resumed.
    vocab = recognizer.ctc_vocabulary
    spell = lambda text: [vocab.index("|" if c == " " else c) for c in text]  # noqa: E731
    texts = [recognizer.decoder_ids_to_text(s) for s in ar.sequences]
    planted = [spell(texts[0]), spell(texts[1])[:4], spell("zz" + texts[2])]
    out = run(PlantedCTC(recognizer, [h if h else [5] for h in planted]), audio[:3], {"mode": "strict"},
              max_new_tokens=12)
    assert out.sequences == ar.sequences
    assert recognizer.ctc_to_text([vocab.index(c) for c in "ab|c"]) == "ab c"
    assert recognizer.text_to_decoder_ids("ab c") == [0, 1, 2, 0, 3]  # leading space, as Whisper writes


def test_assisted_generation_peer_runs(audio, torch_kernels):
    from mmspec.speech.hf import tiny_random_whisper

    recognizer = tiny_random_recognizer()
    waves, n = pad_waves(audio[:2])
    peer = recognizer.assisted_generation(waves, n, tiny_random_whisper(7, decoder_layers=1), max_new_tokens=6)
    ar = run(recognizer, audio[:2], max_new_tokens=6)
    assert peer["sequences"] == ar.sequences  # greedy assisted generation is lossless too
    assert 0 < peer["target_nfe"] <= 12


def test_ctc_hypotheses_retokenize_for_whisper(audio):
    recognizer = tiny_random_recognizer()
    vocab = recognizer.ctc_vocabulary
    planted = PlantedCTC(recognizer, [[vocab.index(c) for c in "hi|yo"]])
    waves, n = pad_waves(audio[:1])
    hyps = ctc_hypotheses(recognizer, planted.encode(waves, n))
    assert hyps.ids == [recognizer.text_to_decoder_ids("hi yo")]
    assert math.isfinite(float(hyps.max_entropy[0]))


def test_resync_stays_lossless_and_redrafts_after_a_slip(audio, torch_kernels):
    recognizer = BundledRecognizer(tiny_asr_model(sharpen=8.0))
    ar = run(recognizer, audio)
    texts = [s[:-1] if s[-1] == EOS else s for s in ar.sequences]
    space = recognizer.word_boundary_ids[0]

    def clean_spot(t):  # a position whose neighbours differ, so the slip is unambiguous
        return next(i for i in range(2, len(t) - 2) if len({t[i - 1], t[i], t[i + 1], corrupted(t, i)[i]}) == 4)

    s0 = clean_spot(texts[0])
    merged = texts[2][:3] + texts[2][4:]  # CTC lost AR's 4th token (a missed word boundary if it is a space)
    planted = [corrupted(texts[0], s0),  # substitution
               texts[1][:3] + [9] + texts[1][3:],  # CTC inserted a token
               merged, texts[3][:2]]
    plain = run(PlantedCTC(recognizer, planted), audio, {"mode": "strict", "resync": False})
    resync = run(PlantedCTC(recognizer, planted), audio, {"mode": "strict"})  # resync is the default
    assert resync.sequences == ar.sequences == plain.sequences
    assert resync.stats.nfe_per_sample < plain.stats.nfe_per_sample
    # A substitution: verify, then one more verify of the re-aligned rest (which is right) finishes the row.
    one = run(PlantedCTC(recognizer, planted[:1]), audio[:1], {"mode": "strict", "resync": True})
    assert one.stats.target_nfe == 2
    if texts[2][3] == space:  # the boundary rule applies only when the lost token is a space
        two = run(PlantedCTC(recognizer, [merged]), audio[2:3], {"mode": "strict", "resync": True})
        assert two.stats.target_nfe == 2
    for batch_size in (1, 3):
        again = run(recognizer, audio, {"mode": "relaxed", "tau": None, "resync": True}, batch_size=batch_size)
        assert len(again.sequences) == 4


def test_resync_alignment_rules():
    from mmspec.common.draft import StepContext
    from mmspec.plugins.ctc_draft import CTCHypothesisDrafter

    space = 4
    hyps = [[10, 11, 12, 13, EOS], [10, 11, 12, 13, EOS], [10, 11, 12, 13, EOS], [10, 11, 12, 13, EOS]]
    drafter = CTCHypothesisDrafter(hyps, pad_id=EOS, resync=True, boundary_ids=(space,))
    drafter.begin(torch.empty(len(drafter.request_hyps), 0, dtype=torch.long), None)
    ctx = StepContext(last_tokens=torch.ones(4, dtype=torch.long), positions=torch.zeros(4, dtype=torch.long),
                      num_draft_tokens=5, logits=LogitsPipeline(), generator=None,
                      remaining=torch.full((4,), 50))
    assert drafter.propose(ctx).tokens.tolist() == hyps
    # Row 0: 11 was wrong, the decoder said 20 (substitution). Row 1: the decoder said 12 where 11 stood
    # (CTC inserted 11). Row 2: the decoder said a space where 11 stood (CTC merged two words). Row 3: all kept.
    num = torch.tensor([1, 1, 1, 5])
    tokens = torch.tensor([[10, 20, -1, -1, -1, -1], [10, 12, -1, -1, -1, -1], [10, space, -1, -1, -1, -1],
                           [10, 11, 12, 13, EOS, 7]])
    drafter.commit(ctx, Acceptance(num, tokens))
    assert drafter.cursor == [2, 3, 1, 5]
    nxt = drafter.propose(ctx)
    assert nxt.lengths.tolist() == [3, 2, 4, 0]
    assert nxt.tokens[0, :3].tolist() == [12, 13, EOS] and nxt.tokens[2, :4].tolist() == [11, 12, 13, EOS]


def test_backoff_probes_and_pauses_after_poor_passes_then_recovers():
    from mmspec.common.draft import StepContext
    from mmspec.plugins.ctc_draft import (MAX_PAUSE_STEPS, POOR_PASS_TOKENS, PROBE_TOKENS,
                                          CTCHypothesisDrafter)

    garbage = list(range(10, 30)) * 30  # 600 tokens the decoder never agrees with
    good = list(range(10, 70))
    drafter = CTCHypothesisDrafter([garbage, good], pad_id=EOS, resync=True, backoff=True)
    drafter.begin(torch.empty(len(drafter.request_hyps), 0, dtype=torch.long), None)
    ctx = StepContext(last_tokens=torch.ones(2, dtype=torch.long), positions=torch.zeros(2, dtype=torch.long),
                      num_draft_tokens=600, logits=LogitsPipeline(), generator=None, remaining=torch.full((2,), 1000))

    def step(accept_row0, accept_row1):
        draft = drafter.propose(ctx)
        lengths = [0, 0] if draft.lengths is None else draft.lengths.tolist()
        num = torch.tensor([min(accept_row0, lengths[0]), min(accept_row1, lengths[1])])
        tokens = torch.full((2, 601), -1)
        tokens[:, 0] = 99  # the decoder's correction: never a hypothesis token
        drafter.commit(ctx, Acceptance(num, tokens))
        return lengths

    # Row 0 keeps nothing; row 1 keeps a long prefix each time and is never limited.
    assert step(0, 30) == [600, 60]
    assert step(0, POOR_PASS_TOKENS) == [599, 29]  # second poor pass: row 0 backs off after it
    lengths = [step(0, POOR_PASS_TOKENS) for _ in range(300)]
    row0 = [a for a, _ in lengths]
    assert row0[0] == 0  # a pause of one step, then probes of PROBE_TOKENS with doubling pauses between
    probes = [i for i, n in enumerate(row0) if n > 0]
    assert {row0[i] for i in probes} == {PROBE_TOKENS}
    gaps = [b - a - 1 for a, b in zip(probes, probes[1:])]
    assert gaps[:6] == [2, 4, 8, 16, MAX_PAUSE_STEPS, MAX_PAUSE_STEPS] and max(gaps) == MAX_PAUSE_STEPS
    assert len(probes) == 13  # 13 probes of 8 tokens in 300 steps instead of 300 drafts of ~500
    assert lengths[0][1] > PROBE_TOKENS and drafter.window[1] is None  # the good row is never limited
    # One good pass restores full drafts.
    drafter.pause[0] = 0
    step(PROBE_TOKENS, 0)
    assert drafter.window[0] is None and drafter.propose(ctx).lengths[0] > PROBE_TOKENS
    with pytest.raises(ValueError, match="backoff needs resync"):
        CTCHypothesisDrafter([good], pad_id=EOS, resync=False, backoff=True)


def test_backoff_stays_lossless_on_unrelated_hypotheses(audio):
    """Hypotheses that have nothing to do with the audio (the out-of-domain worst case): strict is still
    plain AR token for token, with and without back-off, and back-off verifies far fewer draft tokens."""
    recognizer = BundledRecognizer(tiny_asr_model(sharpen=8.0))
    ar = run(recognizer, audio, max_new_tokens=48)
    unrelated = [[3 + (7 * i + b) % 28 for i in range(40)] for b in range(4)]
    kwargs = {"mode": "strict", "tau": None}
    always = run(PlantedCTC(recognizer, unrelated), audio, {**kwargs, "backoff": False}, max_new_tokens=48)
    backoff = run(PlantedCTC(recognizer, unrelated), audio, kwargs, max_new_tokens=48)
    assert backoff.sequences == always.sequences == ar.sequences
    for b in range(4):  # batch 1: each row's drafts and pauses are its own
        alone = run(PlantedCTC(recognizer, unrelated[b:b + 1]), audio[b:b + 1], kwargs, batch_size=1,
                    max_new_tokens=48)
        assert alone.sequences == ar.sequences[b:b + 1]
    assert backoff.stats.target_width < 0.5 * always.stats.target_width


def test_token_surprise_by_hand():
    from mmspec.plugins.ctc_draft.kernels import emitted_token_surprise

    # Frames: blank, a (p = .9), a (repeat: not an emission), blank (p = .4, unsure but no token), b (p = .6).
    probs = torch.tensor([[[0.8, 0.1, 0.1], [0.05, 0.9, 0.05], [0.1, 0.8, 0.1], [0.4, 0.3, 0.3],
                           [0.2, 0.2, 0.6], [0.1, 0.1, 0.8]]])
    got = emitted_token_surprise(probs.log(), torch.tensor([5]), blank=0)  # the 6th frame is padding
    torch.testing.assert_close(got, -torch.tensor([0.6]).log())
    assert emitted_token_surprise(probs.log(), torch.tensor([1]), blank=0).tolist() == [0.0]  # nothing emitted


def test_gate_calibration_by_hand():
    from mmspec.plugins.ctc_draft.calibrate import auroc, calibrate_tau, gate_outcome

    assert auroc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert auroc([0.1, 0.2, 0.9, 0.8], [True, True, False, False]) == 0.0
    assert auroc([0.5, 0.5, 0.5], [True, False, False]) == 0.5  # ties count half
    assert auroc([0.3, 0.7, 0.5, 0.6], [True, True, False, False]) == 0.5
    with pytest.raises(ValueError, match="both classes"):
        auroc([0.1, 0.2], [True, True])
    records = [{"token": s, "wrong": w} for s, w in
               [(0.1, False), (0.2, False), (0.3, True), (0.4, False), (0.5, False), (0.6, True), (0.9, True)]]
    assert calibrate_tau(records, "token", 0.0) == 0.2
    assert calibrate_tau(records, "token", 0.25) == 0.5  # 1 wrong of 5
    assert calibrate_tau(records, "token", 1.0) == 0.9
    assert calibrate_tau([{"token": 0.1, "wrong": True}], "token", 0.5) is None
    tied = [{"token": 0.2, "wrong": False}, {"token": 0.2, "wrong": True}]
    assert calibrate_tau(tied, "token", 0.0) is None  # a tie is taken whole or not at all
    assert gate_outcome(records, "token", 0.5) == {"gated": 5 / 7, "wrong_among_gated": 0.2}
    with pytest.raises(ValueError, match="statistic"):
        calibrate_tau(records, "median", 0.1)


def test_gate_records_mark_wrong_hypotheses():
    from mmspec.plugins.ctc_draft.calibrate import gate_records

    recognizer = BundledRecognizer(tiny_asr_model())
    ids = [recognizer.text_to_decoder_ids("hi yo"), recognizer.text_to_decoder_ids("ok")]
    encoded = PlantedCTC(recognizer, ids).encode(torch.zeros(2, 1600), torch.tensor([1600, 1600]))
    records = gate_records(recognizer, encoded, ["Hi, yo!", "no"])
    assert [r["wrong"] for r in records] == [False, True]
    assert all(set(r) == {"max", "mean", "token", "wrong"} for r in records)


def test_redraft_tokens_caps_only_the_drafts_after_the_first_pass(audio):
    from mmspec.common.draft import StepContext
    from mmspec.plugins.ctc_draft import CTCHypothesisDrafter

    hyps = [list(range(10, 30)), list(range(10, 30))]
    drafter = CTCHypothesisDrafter(hyps, pad_id=EOS, resync=True, redraft_tokens=3)
    drafter.begin(torch.empty(len(drafter.request_hyps), 0, dtype=torch.long), None)
    ctx = StepContext(last_tokens=torch.ones(2, dtype=torch.long), positions=torch.zeros(2, dtype=torch.long),
                      num_draft_tokens=20, logits=LogitsPipeline(), generator=None, remaining=torch.full((2,), 50))
    assert drafter.propose(ctx).lengths.tolist() == [20, 20]
    drafter.commit(ctx, Acceptance(torch.tensor([5, 20]), torch.full((2, 21), 99)))
    assert drafter.propose(ctx).lengths.tolist() == [3, 0]  # row 1's hypothesis is used up
    # Lossless whatever the cap: real CTC drafts of a tiny model, strict, batch 4.
    recognizer = BundledRecognizer(tiny_asr_model(sharpen=8.0))
    ar = run(recognizer, audio)
    assert run(recognizer, audio, {"mode": "strict", "redraft_tokens": 2}).sequences == ar.sequences


def test_rows_with_junk_posteriors_draft_nothing_and_stay_lossless(audio):
    """max_draft_entropy: right hypotheses spelled by flat posteriors (high mean frame entropy, as noise gives)
    are not drafted — the decode costs AR's forwards — while sharp ones are; both equal AR."""
    recognizer = BundledRecognizer(tiny_asr_model(sharpen=8.0))
    ar = run(recognizer, audio)
    right = [s[:-1] if s[-1] == EOS else s for s in ar.sequences]
    flat = run(PlantedCTC(recognizer, right, confidence=1.0), audio, {"mode": "strict"})
    sharp = run(PlantedCTC(recognizer, right), audio, {"mode": "strict"})
    always = run(PlantedCTC(recognizer, right, confidence=1.0), audio, {"mode": "strict", "max_draft_entropy": None})
    assert flat.sequences == sharp.sequences == always.sequences == ar.sequences
    assert flat.stats.target_nfe == ar.stats.target_nfe
    assert sharp.stats.target_nfe < ar.stats.target_nfe and always.stats.target_nfe < ar.stats.target_nfe
