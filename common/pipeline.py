"""The `Pipeline` base every pipeline derives from (the package's modalities and third parties').

A pipeline owns the components (models, tokenizers, codecs), turns user inputs into prompts and decoded
tokens into outputs, and runs the attached plugin's decoder through one hook:

    request = DecodeRequest(target, logits, structure, eos_token_id=..., ...)
    out = self.run_decoder(request, input_ids, attention_mask, max_new_tokens=..., generator=...)

It offers a token structure (`token_structure`) that plugins check at `load_plugin` time, and it supplies
what the modality-free bench and CLI need: inputs, generation, quality metrics, extra summary fields,
table sections and command-line inputs. `with_plugin` returns a new pipeline sharing the components, so
`load_plugin(name, pipeline=p)` never changes `p`; `save_plugin` / `mmspec.common.loading.load_saved_plugin`
write and read the attached plugin next to the components (pipelines call them from `save_pretrained` /
`from_pretrained`).
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

from .config import PIPELINE_FILE, PLUGIN_FILE  # noqa: F401  (re-exported)
from .decoder import (BatchesInTurn, Decoder, GenerationOutput, autoregressive_decoder,  # noqa: F401
                      check_max_batch_size, refill_blocker)  # (refill_blocker: re-exported for the pipelines)
from .errors import join_named
from .request import DecodeRequest
from .stats import DecodeStats
from .structure import TokenStructure

class TokenProgress:
    """Moves a progress bar by the tokens each decode step commits without making the host wait for the
    device every step: counts stay on the device and are read at most every `interval` seconds (and at
    `close`). A disabled bar reads nothing."""

    def __init__(self, bar, interval: float = 0.25):
        self.bar, self.interval = bar, interval
        self.pending = None
        self.last = time.monotonic()

    def add(self, num_accepted) -> None:
        """num_accepted [B]: drafts each row kept this step (it commits one more token)."""
        if getattr(self.bar, "disable", False):
            return
        step = (num_accepted + 1).sum()
        self.pending = step if self.pending is None else self.pending + step
        if time.monotonic() - self.last >= self.interval:
            self.close()

    def close(self) -> None:
        if self.pending is not None:
            self.bar.update(int(self.pending))
            self.pending = None
        self.last = time.monotonic()


def draws_bars(stream) -> bool:
    """Whether a tqdm bar on `stream` reads as a bar: a terminal, or a notebook (tqdm.auto's widget). In a log
    file, CI output or a pipe, a bar is a run of carriage returns (or nothing, with tqdm's disable=None)."""
    from tqdm.auto import tqdm

    if any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__):
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class BatchProgress:
    """Progress of a loop over batches: tqdm's bar where it draws one (`draws_bars`), else one plain line per
    batch on the same stream ("transcribing: batch 3/10: 24/80 utterances, 41.2 s") so a long run's log shows
    how far it got. config: `set_progress_bar_config`'s tqdm keywords (disable=True: no output at all;
    disable=None: tqdm's "bar on a terminal only", so no lines either). per_batch: the bar counts batches, not
    items (the pipelines' bars always did)."""

    def __init__(self, desc: str, num_batches: int, num_items: int, unit: str = "sample", *,
                 config: dict | None = None, disable: bool = False, per_batch: bool = False):
        import sys

        config = dict(config or {})
        self.stream = config.get("file") or sys.stderr
        bars = draws_bars(self.stream)
        wanted = config.pop("disable", False)
        self.disable = disable or bool(wanted) or (wanted is None and not bars)
        self.desc, self.unit, self.per_batch = config.get("desc", desc), unit, per_batch
        self.num_batches, self.num_items = num_batches, num_items
        self.batches = self.items = 0
        self.begin = time.perf_counter()
        self.bar = None
        if bars and not self.disable:
            from tqdm.auto import tqdm

            shape = {"total": num_batches} if per_batch else {"total": num_items, "unit": unit}
            self.bar = tqdm(**{"desc": desc, **shape, **config})

    def update(self, items: int) -> None:
        """One more batch done, of `items` items."""
        self.batches += 1
        self.items += items
        if self.bar is not None:
            self.bar.update(1 if self.per_batch else items)
        elif not self.disable:
            print(f"{self.desc}: batch {self.batches}/{self.num_batches}: {self.items}/{self.num_items} "
                  f"{self.unit}s, {time.perf_counter() - self.begin:.1f} s", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> "BatchProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def joined_error(errors: list[Exception], head: str = "") -> Exception:
    """One exception, one line, for `errors` that each name their input: `head`, then their messages
    (`join_named`). Its type is theirs when they share one, so a caller catching FileNotFoundError for missing
    files still can; ValueError otherwise."""
    kind = type(errors[0])
    if any(type(e) is not kind for e in errors) or kind not in (ValueError, TypeError, FileNotFoundError):
        kind = ValueError
    return kind(head + join_named([str(e) for e in errors]))


def load_each(items: list, load, what: str) -> list:
    """[load(item, "what[i]") for every item], except that every item is tried before any fails: one bad input
    does not hide the others, so a long call's inputs are fixed in one round, before any model work. A single
    input's error is raised as it is; several inputs' bad ones are named together (`joined_error`)."""
    loaded, errors = [], []
    for i, item in enumerate(items):
        try:
            loaded.append(load(item, f"{what}[{i}]"))
        except (ValueError, TypeError, FileNotFoundError) as error:
            errors.append(error)
    if not errors:
        return loaded
    if len(items) == 1:
        raise errors[0]
    raise joined_error(errors, f"{what}: {len(errors)} of {len(items)} inputs cannot be used: ")


def call_statistics(stats: DecodeStats, num_samples: int) -> dict:
    """A sample's statistics where its own are not known (its decode rows were not its alone): its call's."""
    return {"of": "batch", "batch_size": num_samples, "target_nfe": stats.target_nfe,
            "nfe_per_sample": round(stats.nfe_per_sample, 4), "mean_accepted": round(stats.mean_accepted, 4)}


def own_statistics(forwards: int, committed: int) -> dict:
    return {"target_forwards": forwards, "tokens_committed": committed,
            "mean_accepted": round(committed / max(1, forwards), 4)}


class SampleStream:
    """Hands each sample of a call to `on_sample_done(index, output, statistics)` as soon as every decode row it
    owns has finished, before the call returns: the step callback's `FinishedRows` (decoders that retire rows
    one by one, continuous batching among them) say when. Rows a decoder does not report are handed on at
    `close`, from the call's output. statistics: the sample's own target forwards and committed tokens, summed
    over its rows (`own_statistics`), or its call's (`call_statistics`) where the decoder kept no per-row counts.

    owners[r]: the sample decode row r belongs to (default: row r is sample r); output(index, tokens): the
    sample's output from its rows' tokens, in row order. Each sample is handed on exactly once."""

    def __init__(self, on_sample_done, output, num_samples: int, owners: list[int] | None = None):
        self.on_sample_done, self.output = on_sample_done, output
        self.owners = list(range(num_samples)) if owners is None else list(owners)
        self.num_samples = num_samples
        self.rows_of: list[list[int]] = [[] for _ in range(num_samples)]
        for row, owner in enumerate(self.owners):
            self.rows_of[owner].append(row)
        self.rows_left = [len(rows) for rows in self.rows_of]
        self.tokens: dict[int, list[int]] = {}
        self.counts = [[0, 0] for _ in range(num_samples)]  # [forwards, committed] per sample
        self.done = [False] * num_samples
        self.outputs: list = [None] * num_samples  # each sample's output, once handed on

    def step_callback(self, offset: int = 0, then=None):
        """A decode step callback (for rows numbered from `offset` in this stream) that also calls `then`."""
        def on_step(step, info):
            finished = info.get("finished")
            if finished is not None:
                for row, tokens, forwards, committed in finished.rows():
                    self._row(offset + row, tokens, forwards, committed)
            if then is not None:
                then(step, info)
        return on_step

    def _row(self, row: int, tokens: list[int], forwards: int | None, committed: int | None,
             stats: DecodeStats | None = None) -> None:
        if row in self.tokens:
            return
        owner = self.owners[row]
        self.tokens[row] = tokens
        if forwards is None or self.counts[owner] is None:
            self.counts[owner] = None
        else:
            self.counts[owner][0] += forwards
            self.counts[owner][1] += committed
        self.rows_left[owner] -= 1
        if self.rows_left[owner] == 0:
            self._deliver(owner, stats)

    def _deliver(self, owner: int, stats: DecodeStats | None) -> None:
        output = self.output(owner, [self.tokens[r] for r in self.rows_of[owner]])
        counts = self.counts[owner]
        statistics = own_statistics(*counts) if counts is not None else call_statistics(stats, self.num_samples)
        self.done[owner] = True
        self.outputs[owner] = output
        self.on_sample_done(owner, output, statistics)

    def close(self, sequences: list[list[int]], stats: DecodeStats) -> None:
        """After the call: the rows not handed on yet, from its output `sequences` (one per row) and `stats`."""
        per_row = len(stats.row_forwards) == len(self.owners)
        for row, tokens in enumerate(sequences):
            if row not in self.tokens:
                self._row(row, tokens, stats.row_forwards[row] if per_row else None,
                          stats.row_committed[row] if per_row else None, stats)
        for owner in range(self.num_samples):
            if not self.done[owner]:  # a sample with no rows (silent audio)
                self._deliver(owner, stats)


def hand_on_all(outputs: list, stats: DecodeStats, on_sample_done) -> DecodeStats:
    """Hand every output of a finished call to `on_sample_done` (a `batch_generate` whose samples all finish
    with the call); returns `stats`."""
    per_row = len(stats.row_forwards) == len(outputs)
    for i, output in enumerate(outputs):
        on_sample_done(i, output, own_statistics(stats.row_forwards[i], stats.row_committed[i]) if per_row
                       else call_statistics(stats, len(outputs)))
    return stats


class Pipeline:
    """Base of every mmspec pipeline. Subclasses set `modality` and implement `token_structure`,
    `__call__` and the bench protocol; the rest has working defaults."""

    modality: str = ""  # a label such as "text"; open, not a fixed list
    pipeline_name: str = ""  # the name it is registered under (`register_pipeline`)
    spec = None  # its PipelineSpec (mmspec.common.pipeline_spec): `--set` settings, input flags, `--out` suffixes
    call_defaults: dict = {}  # `__call__` settings `--set` may change in bench / generate, with defaults
    bench_settings: dict = {}  # settings only `mmspec bench` takes (its `bench_generate` consumes them)
    bench_input_settings: tuple = ()  # those of `bench_settings` that choose the inputs (`bench_inputs` takes them)
    bench_num_samples: int = 16
    plugin = None  # the attached plugin (None: plain AR)
    draft_model = None  # a separate draft model, for plugins that declare `needs_draft_model`
    model_name: str | None = None  # the bundled model's name, when loaded as one

    # --- what the tokens are --------------------------------------------------------------------
    @property
    def token_structure(self) -> TokenStructure:
        """The structure of the tokens this pipeline generates (by default settings)."""
        raise NotImplementedError(f"{type(self).__name__} must define token_structure")

    # --- the decode hook ------------------------------------------------------------------------
    def build_decoder(self, request: DecodeRequest) -> Decoder:
        """The attached plugin's decoder for `request` (plain AR when none is attached), taking the whole
        `Decoder` signature: one that cannot admit rows is wrapped in `BatchesInTurn`."""
        if self.plugin is None:
            decoder = autoregressive_decoder(request)
        else:
            decoder = self.plugin.build_decoder(self, request)
            if not isinstance(decoder, Decoder):
                raise TypeError(f"plugin {self.plugin.name!r} built a {type(decoder).__name__}, which does not "
                                "implement the Decoder protocol (generate(...) -> GenerationOutput)")
        blocker = refill_blocker(decoder)
        return decoder if blocker is None else BatchesInTurn(decoder, request.target, blocker)

    def run_decoder(self, request: DecodeRequest, input_ids, attention_mask=None, *, max_new_tokens: int,
                    generator=None, prefill_input: tuple | None = None, callback=None,
                    max_batch_size: int | None = None, arrivals=None) -> GenerationOutput:
        """The one place a plugin's decoder runs: build it for this request, generate.

        max_batch_size: decode at most this many rows at once. A decoder that can (`refill_blocker()` is
        None) admits waiting rows as others finish (continuous batching); any other runs the rows in
        batches one after another. Either way each row's output is the same as decoding it alone.
        arrivals: requests that join while the decode runs (see `Decoder`); needs a decoder that admits rows."""
        check_max_batch_size(max_batch_size)
        return self.build_decoder(request).generate(
            input_ids, attention_mask, max_new_tokens=max_new_tokens, generator=generator,
            prefill_input=prefill_input, callback=callback, max_batch_size=max_batch_size, arrivals=arrivals)

    # --- plugins side by side --------------------------------------------------------------------
    def with_plugin(self, plugin) -> "Pipeline":
        """A new pipeline with the same components (shared, not copied) decoding with `plugin`."""
        clone = copy.copy(self)
        for name, value in vars(self).items():  # per-pipeline settings must not leak between the two
            if isinstance(value, dict) and name.startswith("_progress"):
                setattr(clone, name, dict(value))
        clone.plugin = plugin
        return clone

    # --- persistence -----------------------------------------------------------------------------
    def save_plugin(self, directory: str | os.PathLike) -> None:
        """Write the attached plugin (name, config, any trained heads) into `directory`; nothing for AR. Also
        names this pipeline there, so `--model FOLDER` and `load_saved_pipeline` know what to load."""
        (Path(directory) / PIPELINE_FILE).write_text(json.dumps({"pipeline": self.pipeline_name}, indent=2) + "\n")
        path = Path(directory) / PLUGIN_FILE
        if self.plugin is None:
            if path.exists():
                path.unlink()
            return
        from dataclasses import asdict

        overrides = self.plugin.save_pretrained(Path(directory))
        config = {**asdict(self.plugin.config), **overrides}
        path.write_text(json.dumps({"name": self.plugin.name, "config": config, "paths": sorted(overrides)},
                                   indent=2, default=str))

    @classmethod
    def from_saved(cls, directory: str | os.PathLike, device: str = "cpu") -> "Pipeline":
        """The pipeline `save_pretrained` wrote into `directory`, on `device` (its saved plugin attached)."""
        return cls.from_pretrained(directory, device=device)

    # --- bench protocol (mmspec.common.bench) ----------------------------------------------------
    def bench_inputs(self, num_samples: int, seed: int, **settings) -> list:
        """`num_samples` deterministic inputs (labels, prompts, audio rows, pages) for the bench; `settings`:
        the values of `bench_input_settings`."""
        raise NotImplementedError(f"{type(self).__name__} has no bench inputs")

    def bench_generate(self, inputs: list, batch_size: int, seed: int, settings: dict
                       ) -> tuple[list[list[int]], DecodeStats]:
        """Generate for all inputs, batch by batch; input i always uses generator seed + i."""
        raise NotImplementedError(f"{type(self).__name__} has no bench generation")

    def bench_quality(self, inputs: list, sequences: list[list[int]]) -> dict:
        """Quality metrics of generated sequences (names -> numbers). Optionally also "per_sample":
        {metric: (numerators, denominators)}, one pair per input, with metric = Σ numerators / Σ denominators
        (an accuracy: hits and ones; a per-token NLL: nats and tokens; a corpus error rate: errors and
        reference lengths): bench and `generate --compare` then give plugin − AR a paired-bootstrap interval
        (`mmspec.common.stats.paired_bootstrap`)."""
        return {}

    def bench_compare(self, inputs: list, baseline: list[list[int]], accelerated: list[list[int]]) -> dict:
        """Comparisons of the two sides' outputs beyond exact match (e.g. distances between the token
        distributions of sampled runs, with their noise level); stored as the row's `comparison`."""
        return {}

    def bench_summary(self, inputs: list, stats: DecodeStats, seconds: float) -> dict:
        """Extra summary fields of one side of a bench row (e.g. a real-time factor over input media)."""
        return {}

    @classmethod
    def bench_sections(cls, results: list[dict]) -> list[tuple[str, str, str]]:
        """(title, intro, markdown table) sections of BENCHMARKS.md for this pipeline's bench rows."""
        return []

    def enable_compile(self, compile=True) -> "Pipeline":
        """Run the target's step forwards compiled at static shapes (`mmspec.common.compiled`); pipelines whose
        adapters keep a static KV cache override this."""
        if compile is False or compile is None:
            return self
        raise ValueError(f"compile: {type(self).__name__} cannot compile its forwards yet (its adapters have no "
                         "static KV cache); use compile=False")

    def continuous_batching_blocker(self) -> str | None:
        """None when `__call__(..., max_batch_size=)` refills rows with the attached plugin (continuous
        batching), else why not. Pipelines whose `__call__` takes max_batch_size override this."""
        return f"{type(self).__name__} does not take max_batch_size"

    # --- batch protocol (mmspec batch, mmspec.common.batch) ----------------------------------------
    batch_fields: dict = {}  # manifest field -> what it holds; the runner rejects lines with other fields
    batch_suffix: str = ".json"  # the extension of one sample's output file

    def batch_input(self, record: dict, base_dir: Path):
        """One manifest line's input, checked without model work (raise ValueError naming the field and what
        is allowed). `record` holds this pipeline's `batch_fields` only; relative paths are under base_dir."""
        raise NotImplementedError(f"{type(self).__name__} does not support `mmspec batch`")

    def batch_generate(self, inputs: list, generators: list, call: dict, on_sample_done) -> DecodeStats:
        """Generate one output per input (sample i draws from generators[i] only), handing each to
        on_sample_done(index, output, statistics) as soon as it is ready — as its decode rows finish where the
        pipeline's `__call__` streams (`SampleStream`), else all at the end (`hand_on_all`) — and return the
        call's statistics. The runner writes each sample's files when it is handed on."""
        raise NotImplementedError(f"{type(self).__name__} does not support `mmspec batch`")

    def batch_write(self, output, path: Path) -> None:
        """Write one `batch_generate` output to `path` (a temporary name ending in `batch_suffix`)."""
        raise NotImplementedError(f"{type(self).__name__} does not support `mmspec batch`")

    # --- command line (mmspec generate) -----------------------------------------------------------
    def cli_inputs(self, args) -> tuple[list, bool]:
        """`mmspec generate`'s inputs in this pipeline's bench terms (for `--compare`), and whether they carry
        references the bench's quality metrics can score (the held-out set, class labels)."""
        raise NotImplementedError(f"{type(self).__name__} does not support `mmspec generate --compare`")

    @staticmethod
    def cli_held_out(rows: list, num: int, what: str, flag: str) -> list:
        """The first `num` of a held-out set for `mmspec generate` without inputs; more is an error, not a
        silent clamp."""
        if num > len(rows):
            raise ValueError(f"--num must be at most {len(rows)} (the held-out {what}) without {flag}, got {num}")
        return rows[:num]

    @classmethod
    def add_cli_arguments(cls, parser) -> None:
        """Add this pipeline's input flags to `mmspec generate`'s parser (its spec's, by default)."""
        if cls.spec is not None:
            cls.spec.add_arguments(parser)

    def cli_generate(self, args, call: dict) -> int:
        """Run `mmspec generate` with the parsed flags and `--set` call settings; returns an exit code."""
        raise NotImplementedError(f"{type(self).__name__} does not support `mmspec generate`")
