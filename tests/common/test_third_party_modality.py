"""A new modality from outside the package: a pip-installed package registers a pipeline, its bundled
model, its own token structure and a plugin for it through entry points, and everything runs end to end
(load_plugin, greedy == AR, bench with its own table section, the CLI with its own input flag) with no
change to `mmspec.common`."""

import importlib
import json
import sys

import pytest
import torch
from toy_packages import install_package

import mmspec.common.registry as registry
from mmspec.common.bench import run_bench, write_markdown
from mmspec.common.cli import main
from mmspec.common.loading import load_plugin
from mmspec.common.registry import bundled_models, get_pipeline_class, list_pipelines, list_plugins

pytestmark = pytest.mark.e2e

MODULE = '''
"""mmspec-loops: a toy modality. Token sequences that loop with a period; the `loop_draft` plugin drafts
the token one period back (a structure only this modality offers) and verifies by greedy match."""
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mmspec.common.accept import Draft, GreedyMatch, SpeculativeSampling
from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.draft import Drafter
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import HFCausalLM
from mmspec.common.pipeline import Pipeline
from mmspec.common.plugin import DecodeRequest, Plugin
from mmspec.common.registry import field_range, register_bundled_model
from mmspec.common.stats import DecodeStats
from mmspec.common.structure import TokenStructure

VOCAB = 16


@dataclass(frozen=True, eq=False)
class Loop(TokenStructure):
    period: int


class LoopPipeline(Pipeline):
    modality = "loops"
    call_defaults = {"max_new_tokens": 12, "temperature": 0.0}
    bench_num_samples = 4

    def __init__(self, model, period=3):
        self.model, self.period = model, period
        self.target = HFCausalLM(model)

    @property
    def token_structure(self):
        return Loop(self.period)

    def __call__(self, starts, max_new_tokens=12, temperature=0.0, generator=None):
        if not starts or any(not 0 <= s < VOCAB for s in starts):
            raise ValueError(f"starts must be a non-empty list of ints in [0, {VOCAB - 1}], got {starts!r}")
        request = DecodeRequest(self.target, LogitsPipeline(temperature=temperature), self.token_structure)
        ids = torch.tensor([[1, s] for s in starts])
        return self.run_decoder(request, ids, max_new_tokens=max_new_tokens, generator=generator)

    def bench_inputs(self, num_samples, seed):
        return [(seed + i) % VOCAB for i in range(num_samples)]

    def bench_generate(self, inputs, batch_size, seed, settings):
        sequences, stats = [], DecodeStats()
        for start in range(0, len(inputs), batch_size):
            out = self(inputs[start:start + batch_size], **settings)
            sequences += out.tolist()
            stats = stats.merge(out.stats)
        return sequences, stats

    def bench_quality(self, inputs, sequences):
        return {"distinct": sum(len(set(s)) for s in sequences) / len(sequences)}

    @classmethod
    def bench_sections(cls, results):
        rows = [f"| {r['plugin']} | {r['baseline']['quality']['distinct']:.1f} |" for r in results]
        return [("Loops", "Distinct tokens per sample.", "\\\\n".join(["| plugin | distinct |", "|---|---|"] + rows))]

    @classmethod
    def add_cli_arguments(cls, parser):
        parser.add_argument("--start", type=int, action="append", default=[])

    def cli_generate(self, args, call):
        out = self(args.start or [0], **call)
        print("loops:", out.tolist())
        return 0


def tiny_loop_pipeline(device="cpu"):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LoopPipeline(LlamaForCausalLM(config).eval())


register_bundled_model("loops-tiny", tiny_loop_pipeline, modality="loops")


class PeriodDrafter(Drafter):
    """Drafts each next token as the one `period` positions back (the prompt's last token before that)."""

    def __init__(self, period, k):
        self.period, self.k, self.history = period, k, None

    def begin(self, input_ids, attention_mask):
        self.history = [row.tolist() for row in input_ids]

    def propose(self, ctx):
        rows = []
        for b, last in enumerate(ctx.last_tokens.tolist()):
            seq = self.history[b] + [last]
            for _ in range(self.k):
                seq.append(seq[-self.period] if len(seq) >= self.period else seq[-1])
            rows.append(seq[-self.k:])
        return Draft(tokens=torch.tensor(rows, device=ctx.last_tokens.device))

    def commit(self, ctx, acceptance, target_probs=None, output=None):
        for b, (last, num) in enumerate(zip(ctx.last_tokens.tolist(), acceptance.num_accepted.tolist())):
            self.history[b] += [last] + acceptance.tokens[b, :num].tolist()

    def select_rows(self, rows):
        self.history = [self.history[i] for i in rows.tolist()]


@dataclass
class LoopConfig:
    num_draft_tokens: int = field_range(1, 8, default=3, doc="tokens drafted per step")


class LoopDraftPlugin(Plugin):
    modality = "loops"
    lossless = True
    paper = "Loops et al. 2099"
    Config = LoopConfig
    requires = Loop

    def build_decoder(self, pipeline, request):
        rule = GreedyMatch() if request.logits.greedy else SpeculativeSampling()
        drafter = PeriodDrafter(request.structure.period, self.config.num_draft_tokens)
        return SpeculativeDecoder(request.target, drafter, rule, request.logits,
                                  num_draft_tokens=self.config.num_draft_tokens)
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "mmspec-loops"
version = "0.0.1"

[project.entry-points."mmspec.pipelines"]
loops = "mmspec_loops:LoopPipeline"

[project.entry-points."mmspec.plugins"]
loop_draft = "mmspec_loops:LoopDraftPlugin"

[tool.setuptools]
py-modules = ["mmspec_loops"]
'''


@pytest.fixture(scope="module")
def loops_site(tmp_path_factory):
    return install_package(tmp_path_factory, "loops", {"pyproject.toml": PYPROJECT, "mmspec_loops.py": MODULE})


@pytest.fixture
def loops(loops_site, monkeypatch):
    monkeypatch.syspath_prepend(str(loops_site))
    importlib.invalidate_caches()

    def cleanup():
        registry._REGISTRY.pop("loop_draft", None)
        registry._PIPELINES.pop("loops", None)
        registry._BUNDLED.pop("loops-tiny", None)
        sys.modules.pop("mmspec_loops", None)

    cleanup()
    registry.refresh_plugins()
    yield
    cleanup()


def test_a_new_modality_registers_and_runs_end_to_end(loops, tmp_path, capsys):
    assert "loops" in list_pipelines() and "loops-tiny" in bundled_models("loops")
    assert "loop_draft" in list_plugins("loops") and "loop_draft" not in list_plugins("vision")
    assert "ar" in list_plugins("loops")

    pipe = load_plugin("loop_draft")  # the modality's bundled model, found through the registry
    assert type(pipe).__name__ == "LoopPipeline" and type(pipe) is get_pipeline_class("loops")
    ar = load_plugin("ar", pipeline=pipe)
    starts = [0, 5, 9]
    fast, plain = pipe(starts, max_new_tokens=12), ar(starts, max_new_tokens=12)
    assert torch.equal(fast.sequences, plain.sequences)  # greedy match: lossless
    assert fast.stats.target_nfe < plain.stats.target_nfe or fast.stats.mean_accepted >= 1.0
    assert plain.stats.drafter_nfe == 0 and fast.stats.num_rows == 3

    # The core's plugins check the structure: speculative decodes TokenSequence tokens only.
    with pytest.raises(ValueError, match="offers Loop"):
        load_plugin("speculative", pipeline=pipe)

    row = run_bench("loop_draft", num_samples=4, progress=lambda *_: None)
    assert row["pipeline"] == "loops" and row["model"] == "loops-tiny" and row["exact_match_rate"] == 1.0
    assert row["baseline"]["quality"]["distinct"] == row["accelerated"]["quality"]["distinct"]
    markdown = tmp_path / "BENCH.md"
    write_markdown([row], markdown, "test")
    assert "## Loops" in markdown.read_text() and "| loop_draft |" in markdown.read_text()
    json.dumps(row)  # the bench row stays plain JSON

    assert main(["generate", "loop_draft", "--start", "3", "--start", "7"]) == 0
    assert "loops: [[" in capsys.readouterr().out
    assert main(["generate", "loop_draft", "--audio", "x.wav"]) == 2  # not a flag of this pipeline
    assert "--start" in capsys.readouterr().err


def test_the_core_names_no_modality():
    """common/ imports nothing of the package's modalities and names none of their models."""
    from pathlib import Path

    import mmspec.common

    forbidden = ("vision", "speech", "docs_parse", "llamagen", "asr", "whisper")
    for path in Path(mmspec.common.__file__).parent.rglob("*.py"):
        text = path.read_text().lower()
        found = [word for word in forbidden if word in text]
        assert not found, f"{path.name} names {found}"
