"""`TextPipeline` and the bundled byte-level text model pair (`text-tiny`), the default of `speculative`.

Both are plain `transformers.LlamaForCausalLM` checkpoints trained by
`examples/train_text_pair.py` on the docstrings of the Python standard
library (the one real English corpus every Python machine has offline).
Tokens are bytes 0..255 plus BOS and EOS, so no tokenizer file is needed.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import HFCausalLM
from mmspec.common.loading import load_saved_plugin
from mmspec.common.pipeline import Pipeline, SampleStream
from .spec import TEXT_SPEC
from mmspec.common.plugin import DecodeRequest
from mmspec.common.stats import DecodeStats
from mmspec.common.structure import TokenSequence

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258
BUNDLED_DIR = Path(__file__).resolve().parent / "bundled" / "text_tiny"


def encode(text: str, *, add_bos: bool = True) -> list[int]:
    ids = list(text.encode("utf-8"))
    return [BOS_ID] + ids if add_bos else ids


def decode(ids) -> str:
    data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
    return data.decode("utf-8", errors="replace")


def stdlib_docstrings(min_chars: int = 40) -> list[str]:
    """Docstrings of the standard library's top-level modules, in a stable order."""
    stdlib = sysconfig.get_paths()["stdlib"]
    texts = []
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        try:
            tree = ast.parse(Path(path).read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars and doc.isascii():
                    texts.append(doc)
    return texts


@dataclass
class TextSplit:
    train: list[str]
    heldout: list[str]


def split_corpus(texts: list[str], heldout_every: int = 20) -> TextSplit:
    """Every `heldout_every`-th docstring is held out, so prompts in benches are unseen text."""
    heldout = texts[::heldout_every]
    train = [t for i, t in enumerate(texts) if i % heldout_every]
    return TextSplit(train=train, heldout=heldout)


# Prompts used by benches when the corpus cannot be rebuilt (different Python): committed text.
FALLBACK_PROMPTS = [
    "Return the number of items in the",
    "Create a new dictionary with keys from",
    "This module provides functions for",
    "Raise ValueError if the argument is",
    "Convert a string to a list of",
    "Open a file and return a corresponding",
    "The default value is None, which means",
    "Read and return one line from the",
]


def bench_prompts(n: int, prompt_chars: int = 32) -> list[str]:
    """`n` deterministic prompts: the openings of held-out docstrings."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    heldout = split_corpus(stdlib_docstrings()).heldout
    openings = [t[:prompt_chars] for t in heldout if len(t) > prompt_chars] or FALLBACK_PROMPTS
    return [openings[i % len(openings)] for i in range(n)]


def load_text_pair(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """Load the bundled (target, draft) pair as `LlamaForCausalLM` in eval mode."""
    from transformers import LlamaForCausalLM

    missing = [p for p in ("target", "draft") if not (BUNDLED_DIR / p / "config.json").exists()]
    if missing:
        raise FileNotFoundError(
            f"bundled text models {missing} not found under {BUNDLED_DIR}; "
            "run examples/train_text_pair.py to create them"
        )
    models = []
    for name in ("target", "draft"):
        model = LlamaForCausalLM.from_pretrained(BUNDLED_DIR / name, dtype=dtype)
        models.append(model.to(device).eval())
    return tuple(models)


@dataclass
class TextOutput:
    texts: list[str]
    sequences: list[list[int]]  # generated token ids per prompt (EOS included when produced)
    stats: object  # DecodeStats


class TextPipeline(Pipeline):
    """Text generation with any decoding plugin, over a causal LM (and an optional draft LM).

    With `tokenizer=None` the byte-level scheme of the bundled pair is used;
    otherwise a Hugging Face tokenizer (left padding is applied here).
    """

    modality = "text"
    pipeline_name = "text"
    bench_num_samples = 32
    spec = TEXT_SPEC
    call_defaults = TEXT_SPEC.call_defaults

    def __init__(self, model, draft_model=None, tokenizer=None, eos_token_id: int | None = None, plugin=None,
                 model_name: str | None = None):
        self.model = model
        self.target = HFCausalLM(model)
        self.draft_model = draft_model
        self.tokenizer = tokenizer
        if eos_token_id is None:
            eos_token_id = tokenizer.eos_token_id if tokenizer is not None else EOS_ID
        self.eos_token_id = eos_token_id
        self.plugin = plugin
        self.device = self.target.device
        self.model_name = model_name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        self._progress_bar_config = {}

    @property
    def token_structure(self) -> TokenSequence:
        return TokenSequence()

    @classmethod
    def bundled(cls, device: str = "cpu") -> "TextPipeline":
        target, draft = load_text_pair(device)
        return cls(target, draft, model_name="text-tiny")

    # --- persistence ------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """`target/` (and `draft/`) as transformers checkpoints, the tokenizer, and the attached plugin."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory / "target")
        if self.draft_model is not None:
            self.draft_model.save_pretrained(directory / "draft")
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(directory / "tokenizer")
        (directory / "pipeline.json").write_text(json.dumps({"eos_token_id": self.eos_token_id,
                                                             "model_name": self.model_name}))
        self.save_plugin(directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, device: str = "cpu",
                        dtype: torch.dtype = torch.float32) -> "TextPipeline":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        directory = Path(directory)
        if not (directory / "target" / "config.json").exists():
            raise FileNotFoundError(f"{str(directory)!r} is not a saved TextPipeline (no target/config.json)")
        load = lambda name: AutoModelForCausalLM.from_pretrained(directory / name, dtype=dtype).to(device).eval()  # noqa: E731
        draft = load("draft") if (directory / "draft" / "config.json").exists() else None
        tokenizer = AutoTokenizer.from_pretrained(directory / "tokenizer") if (directory / "tokenizer").exists() \
            else None
        meta = json.loads((directory / "pipeline.json").read_text()) if (directory / "pipeline.json").exists() \
            else {}
        return cls(load("target"), draft, tokenizer, eos_token_id=meta.get("eos_token_id"),
                   plugin=load_saved_plugin(directory), model_name=meta.get("model_name"))

    def set_progress_bar_config(self, **kwargs) -> None:
        """Accepted for the diffusers convention; text generation draws no progress bar."""
        self._progress_bar_config = dict(kwargs)

    def encode_batch(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tokenizer is not None:
            self.tokenizer.padding_side = "left"
            enc = self.tokenizer(prompts, return_tensors="pt", padding=True)
            return enc["input_ids"], enc["attention_mask"].bool()
        rows = [encode(p) for p in prompts]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), EOS_ID, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, width - len(r):] = torch.tensor(r)
            mask[i, width - len(r):] = True
        return ids, mask

    def decode_tokens(self, tokens: list[int]) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.decode(tokens, skip_special_tokens=True)
        return decode(tokens)

    @torch.no_grad()
    def __call__(self, prompts, max_new_tokens: int = 96, temperature: float = 0.0, top_k: int | None = None,
                 top_p: float | None = None, generator=None, return_dict: bool = True,
                 max_batch_size: int | None = None, on_sample_done=None):
        """Continue `prompts`. max_batch_size: decode at most this many prompts at once, starting the next
        waiting one as soon as one finishes (continuous batching, where the plugin's decoder supports it);
        None: all at once. on_sample_done(index, text, statistics): called as each completion is ready, before
        the call returns (`SampleStream`)."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or not prompts or any(not isinstance(p, str) for p in prompts):
            raise ValueError(f"prompts must be a non-empty string or list of strings, got {prompts!r}")
        logits = LogitsPipeline(temperature=temperature, top_k=top_k, top_p=top_p)
        draft = self.draft_model
        request = DecodeRequest(self.target, logits, self.token_structure, eos_token_id=self.eos_token_id,
                                pad_token_id=self.eos_token_id,
                                draft_model=None if draft is None else HFCausalLM(draft))
        ids, mask = self.encode_batch(list(prompts))
        stream = None if on_sample_done is None else SampleStream(
            on_sample_done, lambda i, rows: self.decode_tokens(rows[0]), len(prompts))
        out = self.run_decoder(request, ids, mask, max_new_tokens=max_new_tokens, generator=generator,
                               max_batch_size=max_batch_size,
                               callback=None if stream is None else stream.step_callback())
        sequences = out.tolist()
        if stream is not None:
            stream.close(sequences, out.stats)
        texts = [self.decode_tokens(s) for s in sequences]
        if not return_dict:
            return texts, out.stats
        return TextOutput(texts=texts, sequences=sequences, stats=out.stats)

    # --- command line -----------------------------------------------------
    def continuous_batching_blocker(self) -> str | None:
        from mmspec.common.pipeline import refill_blocker

        draft = self.draft_model
        request = DecodeRequest(self.target, LogitsPipeline(), self.token_structure, eos_token_id=self.eos_token_id,
                                pad_token_id=self.eos_token_id, draft_model=None if draft is None else HFCausalLM(draft))
        return refill_blocker(self.build_decoder(request))

    # --- batch protocol (see mmspec.common.batch) ------------------------
    batch_fields = {"prompt": "text to continue"}
    batch_suffix = ".txt"

    def batch_input(self, record: dict, base_dir):
        from mmspec.common.batch import text_field

        return text_field(record, "prompt", self.batch_fields["prompt"])

    def batch_generate(self, inputs: list, generators: list, call: dict, on_sample_done) -> DecodeStats:
        return self(inputs, generator=generators, on_sample_done=on_sample_done, **call).stats

    def batch_write(self, output, path) -> None:
        Path(path).write_text(output + "\n")

    def cli_inputs(self, args):
        return list(args.prompt or bench_prompts(args.num)), True  # NLL under the target needs only the prompt

    def cli_generate(self, args, call: dict) -> int:
        """`mmspec generate PLUGIN --prompt ...`: print completions (and write JSON with --out)."""
        prompts = self.cli_inputs(args)[0]
        sequences, stats = self.bench_generate(prompts, args.batch_size, args.seed, call)
        records = [{"prompt": p, "completion": self.decode_tokens(s)} for p, s in zip(prompts, sequences)]
        for r in records:
            print(f"{r['prompt']!r} -> {r['completion']!r}")
        print(stats)
        if args.out:
            Path(args.out).write_text(json.dumps({"samples": records, "stats": stats.to_dict()}, indent=2))
        return 0

    # --- bench protocol (see mmspec.common.bench) ------------------------
    def bench_inputs(self, num_samples: int, seed: int) -> list[str]:
        return bench_prompts(num_samples)

    def bench_generate(self, inputs: list[str], batch_size: int, seed: int, settings: dict):
        """Generate for all inputs; sample i always uses generator seed+i, whatever the batching."""
        sequences, stats = [], DecodeStats()
        for start in range(0, len(inputs), batch_size):
            chunk = inputs[start:start + batch_size]
            gens = [torch.Generator().manual_seed(seed + start + i) for i in range(len(chunk))]
            out = self(chunk, generator=gens, **settings)
            sequences += out.sequences
            stats = stats.merge(out.stats)
        return sequences, stats

    @torch.no_grad()
    def bench_quality(self, inputs: list[str], sequences: list[list[int]]) -> dict:
        """Mean target NLL (nats/token) of the generated tokens given their prompt."""
        from mmspec.common.stats import PER_SAMPLE

        totals, counts = [], []
        for prompt, seq in zip(inputs, sequences):
            totals.append(0.0)
            counts.append(len(seq))
            if not seq:
                continue
            ids, _ = self.encode_batch([prompt])
            full = torch.cat([ids[0], torch.tensor(seq)])[None].to(self.device)
            logp = self.model(input_ids=full).logits[0, :-1].float().log_softmax(-1)
            totals[-1] = -float(logp[ids.shape[1] - 1:].gather(1, full[0, ids.shape[1]:, None]).sum())
        return {"target_nll": sum(totals) / max(1, sum(counts)), PER_SAMPLE: {"target_nll": (totals, counts)}}


def bundled_pipeline(device: str = "cpu") -> TextPipeline:
    """`text-tiny`: the bundled byte-level LlamaForCausalLM pair (target + draft)."""
    return TextPipeline.bundled(device)
