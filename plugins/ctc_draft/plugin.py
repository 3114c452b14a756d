"""`ctc_draft`: self-speculative ASR with the CTC head as the drafter (Saon, Dekel et al., arXiv:2603.11243).

One encoder pass gives both the CTC posteriors and the decoder's conditioning. Per utterance:

1. **Gate.** If the CTC posteriors are confident — the maximum (or, with ``gate="mean"``, the mean)
   frame entropy over the utterance's own frames, or with ``gate="token"`` the surprise −log p of the least
   sure emitted token, is at most ``tau`` — and the greedy CTC hypothesis is not empty, the hypothesis is
   the transcript; the decoder never runs.
2. **Verify.** Otherwise the hypothesis (re-tokenized into the decoder's vocabulary when they differ),
   followed by end-of-text, is fed to the decoder in one forward. ``strict`` keeps the longest prefix that
   equals the decoder's greedy choice (lossless: identical to plain AR greedy decoding); ``relaxed`` also
   keeps a token whose decoder probability reaches ``floor`` (the paper's likelihood rule).
3. **Resume.** The token after the kept prefix is the decoder's own, and decoding continues from there
   on the verify pass's KV cache, cropped to the kept prefix (the public notebooks restart from scratch):
   with ``resync`` (default) the rest of the hypothesis, re-aligned past the correction, is drafted and
   verified again, so one slip costs one more pass; without it, plain AR finishes the utterance (the
   paper's procedure). With ``backoff`` (default), a row whose passes keep failing drafts short probes
   with growing pauses between them, so speech the CTC head gets wrong costs about what AR does.

Rows are independent: each has its own gate decision, its own kept prefix and its own AR tail, and rows
that finish leave the batch. ``mode="ctc"`` returns the CTC hypotheses (the speed ceiling).
``strict`` is lossless only with the gate off (``tau="auto"`` or ``None``); setting ``tau`` trades that
for speed, and the plugin then reports itself as lossy.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from mmspec.common.accept import Acceptance, AcceptRule, Draft, GreedyMatch, SpeculativeSampling
from mmspec.common.decoder import GenerationOutput, SpeculativeDecoder, renumbered_callback
from mmspec.common.draft import Drafter
from mmspec.common.plugin import DecodeRequest, Plugin
from mmspec.common.registry import register_plugin
from mmspec.common.stats import DecodeStats
from mmspec.speech.structure import GATED_ROWS, CTCTranscript

from .config import (MAX_DRAFT_ENTROPY, RELAXED_DEFAULT_TAU, REDRAFT_TOKENS,  # noqa: F401
                     REFILL_ADMIT_FRACTION, CTCDraftConfig)
from .kernels import ctc_greedy, emitted_token_surprise, floor_accept

__all__ = ["CTCDraftDecoder", "CTCDraftPlugin", "CTCHypothesisDrafter", "OneHotDraftSampling", "ProbabilityFloor",
           "ctc_hypotheses"]


class ProbabilityFloor(AcceptRule):
    """Keep a draft token while it is the decoder's argmax or its probability is at least `floor`."""

    name = "probability_floor"
    lossless = False

    def __init__(self, floor: float):
        if not 0.0 <= floor <= 1.0:
            raise ValueError(f"floor must be in [0, 1], got {floor!r}")
        self.floor = floor

    def __call__(self, draft, target_probs, generator=None):
        if draft.tree is not None:
            raise ValueError("probability_floor verifies chains only")
        num, tokens = floor_accept(draft.tokens, target_probs, self.floor, draft.lengths)
        return Acceptance(num, tokens)


class OneHotDraftSampling(SpeculativeSampling):
    """Speculative sampling for a deterministic draft (q is one-hot on the CTC token): keep it with
    probability p(x), else sample from p with x removed. Lossless under sampling."""

    name = "speculative_sampling_one_hot"
    needs_draft_probs = False


# Back-off of re-drafting (``backoff=True``): a verify pass that keeps fewer than POOR_PASS_TOKENS draft tokens
# (and not the whole draft) is poor. One poor pass is usually a single slip in a good hypothesis (the re-aligned
# rest is then right), so the first one changes nothing; after POOR_PASSES_TO_BACK_OFF in a row the hypothesis
# is treated as unreliable: the row drafts PROBE_TOKENS at a time and skips re-drafting for 1, 2, 4, ...
# MAX_PAUSE_STEPS steps between tries (those steps are plain AR: width 1, nothing wasted). A pass that keeps
# POOR_PASS_TOKENS or more restores full drafts. Speech a model cannot transcribe then costs about what AR does.
POOR_PASS_TOKENS = 4
POOR_PASSES_TO_BACK_OFF = 2
PROBE_TOKENS = 8
MAX_PAUSE_STEPS = 32


class CTCHypothesisDrafter(Drafter):
    """Proposes each row's CTC hypothesis (+ end-of-text). Without `resync` it does so once, and AR
    finishes the utterance after the first rejected token. With `resync`, after a rejection it drafts the
    rest of the hypothesis again, aligned past the decoder's correction c of hypothesis token h[j]:
    c == h[j+1] means CTC inserted h[j] (continue after h[j+1]); c a word boundary the hypothesis lacks
    means CTC merged two words (continue at h[j]); otherwise a substitution (continue at h[j+1]). Steps that
    draft nothing move the cursor by the same rules. With `backoff` (needs `resync`), rows whose drafts keep
    failing draft short probes with pauses between them (see POOR_PASS_TOKENS). Every draft is verified, so
    the alignment guess and the back-off only affect speed, never the output."""

    def __init__(self, hypotheses: list[list[int]], pad_id: int, resync: bool = False,
                 boundary_ids: tuple = (), backoff: bool = False, redraft_tokens: int | None = None):
        if backoff and not resync:
            raise ValueError("backoff needs resync=True (without resync a row drafts once and never again)")
        self.request_hyps = [list(h) for h in hypotheses]  # one per request of the decode call
        self.pad_id = pad_id
        self.resync = resync
        self.backoff = backoff
        self.redraft_tokens = redraft_tokens  # longest re-draft after the first pass (None: the whole rest)
        self.boundary_ids = set(boundary_ids)
        for name in self.ROW_FIELDS:
            setattr(self, name, [])

    # Per-row state, one entry per running row (`select_rows` keeps, `admit` appends).
    ROW_FIELDS = ("hyps", "cursor", "drafted", "poor_passes", "window", "pause", "next_pause", "passes")

    def _start_rows(self, requests: list[int]) -> None:
        """Append rows for `requests` (indices into the call's hypotheses), none of them drafted yet."""
        n = len(requests)
        self.hyps += [self.request_hyps[r] for r in requests]
        self.cursor += [0] * n  # index in the hypothesis of the next position's draft
        self.drafted += [0] * n  # draft tokens each row proposed in the step being verified
        self.poor_passes += [0] * n  # poor verify passes in a row
        self.window += [None] * n  # longest draft a row may propose (None: no limit)
        self.pause += [0] * n  # steps left before a backed-off row drafts again
        self.next_pause += [1] * n
        self.passes += [0] * n  # verify passes a row has drafted in

    def begin(self, input_ids, attention_mask):
        self._start_rows(list(range(input_ids.shape[0])))  # the decode loop starts with requests 0..B-1

    def admit(self, input_ids, attention_mask, ctx):
        self._start_rows(ctx.requests.tolist())

    @property
    def width(self) -> int:
        return max(1, max((len(h) for h in self.request_hyps), default=0))

    def exhausted(self) -> bool:
        """Every running row has drafted its whole hypothesis: until rows are admitted the loop is plain AR."""
        return all(c >= len(h) for c, h in zip(self.cursor, self.hyps))

    def propose(self, ctx):
        device = ctx.last_tokens.device
        batch = ctx.last_tokens.shape[0]
        if self.exhausted():
            self.drafted = [0] * batch
            return Draft(tokens=torch.empty(batch, 0, dtype=torch.long, device=device))
        # A row needs at most remaining − 1 drafts: the verify pass adds one token of its own.
        cap = (ctx.remaining - 1).tolist()
        rows = []
        for b, (h, c, n) in enumerate(zip(self.hyps, self.cursor, cap)):
            if self.pause[b] > 0:
                self.pause[b] -= 1
                n = 0
            elif self.window[b] is not None:
                n = min(n, self.window[b])
            if self.passes[b] > 0 and self.redraft_tokens is not None:
                n = min(n, self.redraft_tokens)
            rows.append(h[c:][: max(0, n)])
        self.drafted = [len(r) for r in rows]
        self.passes = [p + (d > 0) for p, d in zip(self.passes, self.drafted)]
        width = max(self.drafted)
        if width == 0:
            return Draft(tokens=torch.empty(batch, 0, dtype=torch.long, device=device))
        tokens = torch.full((batch, width), self.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            tokens[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        return Draft(tokens=tokens.to(device), lengths=torch.tensor(self.drafted, device=device))

    def commit(self, ctx, acceptance, target_probs=None, output=None):
        if self.exhausted():  # every cursor is at its end and stays there (no host read)
            return
        if not self.resync:  # a row drafts once: after its first pass AR finishes it
            self.cursor = [len(h) if d > 0 else c for h, c, d in zip(self.hyps, self.cursor, self.drafted)]
            return
        for b, (num, correction) in enumerate(zip(acceptance.num_accepted.tolist(),
                                                  acceptance.next_tokens.tolist())):
            h, j = self.hyps[b], self.cursor[b] + num
            if j >= len(h):
                self.cursor[b] = len(h)
            elif j + 1 < len(h) and correction == h[j + 1]:
                self.cursor[b] = j + 2
            elif correction in self.boundary_ids and h[j] not in self.boundary_ids:
                self.cursor[b] = j
            else:
                self.cursor[b] = j + 1
            if self.backoff and self.drafted[b] > 0:
                self._after_pass(b, num)

    def _after_pass(self, b: int, num_accepted: int) -> None:
        if num_accepted >= min(POOR_PASS_TOKENS, self.drafted[b]):
            self.poor_passes[b], self.window[b], self.next_pause[b] = 0, None, 1
            return
        self.poor_passes[b] += 1
        if self.poor_passes[b] >= POOR_PASSES_TO_BACK_OFF:
            self.window[b] = PROBE_TOKENS
            self.pause[b] = self.next_pause[b]
            self.next_pause[b] = min(2 * self.next_pause[b], MAX_PAUSE_STEPS)

    def select_rows(self, rows):
        keep = rows.tolist()
        for name in self.ROW_FIELDS:
            setattr(self, name, [getattr(self, name)[i] for i in keep])


@dataclass
class CTCHypotheses:
    ids: list[list[int]]  # decoder ids per row (no end-of-text)
    max_entropy: torch.Tensor  # [B] float32
    mean_entropy: torch.Tensor  # [B] float32
    empty: torch.Tensor  # [B] bool: the CTC hypothesis has no token
    token_surprise: torch.Tensor | None  # [B] float32: −log of the least sure emitted token's posterior

    def statistic(self, gate: str) -> torch.Tensor:
        """The gate statistic named by ``gate`` (lower = more confident)."""
        if gate == "token" and self.token_surprise is None:
            raise ValueError("gate='token' needs ctc_hypotheses(..., token_surprise=True)")
        return {"max": self.max_entropy, "mean": self.mean_entropy, "token": self.token_surprise}[gate]


def ctc_hypotheses(recognizer, encoded, token_surprise: bool = True) -> CTCHypotheses:
    """Greedy CTC hypotheses of a batch in the decoder's vocabulary, with the gate statistics (the emitted
    tokens' surprise only when asked: it costs another pass over the posteriors)."""
    tokens, counts, max_h, mean_h = ctc_greedy(encoded.ctc_logits, encoded.ctc_lengths, recognizer.ctc_blank_id)
    ids = [recognizer.ctc_to_decoder_ids(row[:count]) for row, count in zip(tokens.tolist(), counts.tolist())]
    empty = torch.tensor([len(x) == 0 for x in ids])
    surprise = (emitted_token_surprise(encoded.ctc_logits, encoded.ctc_lengths, recognizer.ctc_blank_id).cpu()
                if token_surprise else None)
    return CTCHypotheses(ids, max_h.cpu(), mean_h.cpu(), empty, surprise)


class CTCDraftDecoder:
    """The `Decoder` ctc_draft builds: gate, then the core loop with the CTC hypotheses as drafts.

    Rows the gate finishes never reach the decoder; the rest run through `SpeculativeDecoder` on the
    recognizer's decoder over just those rows (the encoder pass is the pipeline's, shared).
    """

    def __init__(self, plugin: "CTCDraftPlugin", recognizer, request: DecodeRequest):
        self.plugin, self.recognizer, self.request = plugin, recognizer, request
        self.encoded = request.conditioning
        if self.encoded is None:
            raise ValueError("ctc_draft needs the encoder output of the batch (DecodeRequest.conditioning)")

    def refill_blocker(self) -> str | None:
        """None when the recognizer's decoder admits utterances into a running batch (continuous batching)."""
        return self.recognizer.continuous_batching_blocker()

    @torch.no_grad()
    def generate(self, input_ids, attention_mask=None, *, max_new_tokens: int, generator=None,
                 prefill_input=None, callback=None, max_batch_size: int | None = None,
                 arrivals=None) -> GenerationOutput:
        """max_batch_size: the decoder runs at most this many of the utterances the gate leaves at once, admitting
        the next as others finish (continuous batching; see `refill_blocker`). arrivals: not taken — the gate
        drafts from the encoder output of the utterances given (`DecodeRequest.conditioning`)."""
        if arrivals is not None:
            raise ValueError("ctc_draft takes no arrivals=: its drafts come from the encoder output of the "
                             "utterances the call was given; start a new call for new audio")
        config, logits = self.plugin.config, self.request.logits
        eos = self.recognizer.eos_token_id
        begin = time.perf_counter()
        gate_reads_tokens = config.gate == "token" and config.mode != "ctc" and self.plugin.tau is not None
        hyps = ctc_hypotheses(self.recognizer, self.encoded, token_surprise=gate_reads_tokens)
        draft_time = time.perf_counter() - begin
        batch = len(hyps.ids)
        if config.mode == "ctc":
            final = torch.ones(batch, dtype=torch.bool)
        elif self.plugin.tau is None:
            final = torch.zeros(batch, dtype=torch.bool)
        else:
            final = (hyps.statistic(config.gate) <= self.plugin.tau) & ~hyps.empty
        sequences: list[list[int] | None] = [None] * batch
        for b in final.nonzero().flatten().tolist():
            sequences[b] = (hyps.ids[b] + [eos])[:max_new_tokens]
        stats = DecodeStats(num_rows=0)
        rows = (~final).nonzero().flatten()
        if rows.numel():
            if config.mode == "relaxed" and not logits.greedy:
                raise ValueError("ctc_draft mode='relaxed' decodes greedily: use temperature=0 "
                                 "(mode='strict' supports sampling)")
            rule = ProbabilityFloor(config.floor) if config.mode == "relaxed" else (
                GreedyMatch() if logits.greedy else OneHotDraftSampling())
            limit = math.inf if config.max_draft_entropy is None else config.max_draft_entropy
            drafts = [hyps.ids[b] + [eos] if float(hyps.mean_entropy[b]) <= limit else [] for b in rows.tolist()]
            drafter = CTCHypothesisDrafter(drafts, pad_id=eos, resync=config.resync,
                                           boundary_ids=tuple(self.recognizer.word_boundary_ids),
                                           backoff=config.backoff and config.resync,
                                           redraft_tokens=config.redraft_tokens or None)
            target = self.recognizer.decoder(self.encoded, rows)
            loop = SpeculativeDecoder(target, drafter, rule, logits, num_draft_tokens=drafter.width,
                                      eos_token_id=eos, pad_token_id=eos)
            if max_batch_size is not None:
                loop.admit_at_least = max(1, math.ceil(max_batch_size * config.refill_admit_fraction))
            gens = [generator[b] for b in rows.tolist()] if isinstance(generator, list) else generator
            index = rows.to(input_ids.device)
            out = loop.generate(input_ids[index], None if attention_mask is None else attention_mask[index],
                                max_new_tokens=max_new_tokens, generator=gens,
                                callback=renumbered_callback(callback, index),  # rows of the whole call
                                max_batch_size=max_batch_size)
            stats = out.stats
            for b, seq in zip(rows.tolist(), out.tolist()):
                sequences[b] = seq
        gated = int(final.sum())
        if gated and len(stats.row_forwards) == rows.numel():  # per-row counts of every row, in input order
            forwards, committed = [0] * batch, [len(seq) for seq in sequences]  # a gated row: no target forward
            for position, b in enumerate(rows.tolist()):
                forwards[b], committed[b] = stats.row_forwards[position], stats.row_committed[position]
            stats.row_forwards, stats.row_committed = forwards, committed
        stats.time_draft_s += draft_time
        stats.num_rows += gated
        stats.add(GATED_ROWS, gated)
        stats.tokens += sum(len(sequences[b]) for b in final.nonzero().flatten().tolist())
        stats.time_total_s = time.perf_counter() - begin
        pad = self.request.pad_token_id
        out_ids = torch.full((batch, max_new_tokens), pad, dtype=torch.long)
        for b, seq in enumerate(sequences):
            out_ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
        return GenerationOutput(sequences=out_ids, lengths=lengths, stats=stats)


@register_plugin("ctc_draft")
class CTCDraftPlugin(Plugin):
    modality = "speech"
    lossless = True
    paper = "arXiv:2603.11243"
    requires = CTCTranscript

    Config = CTCDraftConfig

    bench_default_variants = (
        {"batch_size": 1, "settings": {"mode": "strict"}},
        {"batch_size": 1, "settings": {"mode": "relaxed"}},
        {"batch_size": 1, "settings": {"mode": "ctc"}},
        {"batch_size": 8, "settings": {"mode": "strict"}},
        {"batch_size": 8, "settings": {"mode": "relaxed"}},
        # Speech unlike the training data: other text, other voices; then speech the model cannot transcribe.
        {"batch_size": 1, "settings": {"mode": "strict", "test_set": "out_of_domain"}},
        {"batch_size": 1, "settings": {"mode": "relaxed", "test_set": "out_of_domain"}},
        {"batch_size": 1, "settings": {"mode": "ctc", "test_set": "out_of_domain"}},
        {"batch_size": 8, "settings": {"mode": "strict", "test_set": "out_of_domain"}},
        {"batch_size": 1, "num_samples": 40, "settings": {"mode": "strict", "test_set": "foreign"}},
        # Noise: AR's own transcripts are short (~24 steps), so the row times little work; 120 clips keep the
        # machine's jitter (a few % on 40 clips) below the effect being measured.
        {"batch_size": 1, "num_samples": 120, "settings": {"mode": "strict", "test_set": "noise"}},
    )
    bench_variants = tuple(
        [{"batch_size": 1, "settings": {"mode": "relaxed", "tau": t}} for t in (0.5, 2.0, math.inf)]
        + [{"batch_size": 1, "settings": {"mode": "relaxed", "gate": "mean", "tau": t}} for t in (0.1, 0.3)]
        + [{"batch_size": 1, "settings": {"mode": "relaxed", "floor": f}} for f in (0.01, 0.3, 0.6)]
        + [{"batch_size": 1, "settings": {"mode": "strict", "tau": 1.0}}]
        + [{"batch_size": 1, "settings": {"mode": m, "resync": False}} for m in ("strict", "relaxed")]
        + [{"batch_size": 1, "settings": {"mode": "strict", "backoff": False, "test_set": t}}
           for t in ("in_domain", "out_of_domain")]
        + [{"batch_size": 1, "settings": {"mode": "relaxed", "gate": "token", "tau": t}} for t in (0.5, 1.5)]
        + [{"batch_size": 8, "settings": {"mode": "strict", "resync": False}}]
        + [{"batch_size": 1, "model": "whisper-tiny-random", "settings": {"mode": "strict"}}]
    )

    def __init__(self, **config):
        super().__init__(**config)
        self.lossless = self.config.mode == "strict" and self.tau is None  # the gate makes strict lossy

    @property
    def tau(self) -> float | None:
        """The gate threshold in use (None: gate off)."""
        if self.config.tau == "auto":
            return RELAXED_DEFAULT_TAU if self.config.mode == "relaxed" else None
        return None if self.config.tau is None else float(self.config.tau)

    def build_decoder(self, pipeline, request):
        return CTCDraftDecoder(self, pipeline.recognizer, request)

    def bench_peer(self, pipeline, inputs, settings):
        """`transformers` assisted generation on the same Whisper, when the pipeline carries an assistant."""
        assistant = pipeline.peer_assistant
        if assistant is None:
            return None
        from mmspec.speech.pipeline import load_audio, pad_waves

        waves, num_samples = pad_waves([load_audio(row["audio"]) for row in inputs])
        out = pipeline.recognizer.assisted_generation(waves, num_samples, assistant, settings["max_new_tokens"])
        return {"name": "transformers assisted generation (1-layer Whisper assistant)", "batch_size": 1,
                "nfe_per_sample": out["target_nfe"] / len(inputs), "latency_s_per_sample": out["time_s"] / len(inputs),
                "sequences": out["sequences"]}
