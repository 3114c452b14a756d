"""`mmspec batch`: generate for every line of a manifest, sharded over processes, resumable after a crash.

    mmspec batch PLUGIN [--model NAME] --inputs manifest.jsonl --out DIR [--batch-size 8] [--set KEY=VALUE]
    accelerate launch --num_processes N -m mmspec batch ...     (or torchrun --nproc_per_node N -m mmspec ...)
    mmspec batch ... --engine ray                                (Ray Data; `pip install 'mmspec[dist]'`)

Each manifest line is one JSON object in the pipeline's own input terms (`batch_fields`: a class label or
prompt for images, an audio path to transcribe, a text to say aloud, a page path for documents, a prompt for text), with
an optional `id` (the output's file name; default: the line's index) and `seed` (default: --seed + index).
Every line is checked before any generation; the bad ones are one error naming each line number and field
(the first ten, then how many more), so a manifest is fixed in one round.

Out folder:
    batch.json               what ran (plugin, model, settings, manifest digest); a resume must match it
    samples/ID.png|wav|md..  one output per sample
    samples/ID.json          its record: inputs, seed, output file and digest, decoding statistics
    runs/RUN.rankR.jsonl     a line per sample written and per decode call, of every run (crashes included)
    manifest.jsonl           every record, in input order (written when all samples are done)
    summary.json             statistics summed over all samples and over all runs

Each sample is written as soon as it is finished, not when its decode call returns: with continuous batching
the moment its rows finish, otherwise when its batch does. Writes are atomic (a temporary name, then rename),
and a sample counts as done only when its record exists and its output's digest matches: a kill -9 at any
moment leaves no half file that passes for a finished one, and a resume redoes exactly the unfinished samples.
Sample i draws only from its own generator, so the outputs do not
depend on the number of processes or the batch size, as far as the backend's float rounding is the same
for every process and batch shape. On CPU, give every run the same thread count (torchrun and accelerate
set OMP_NUM_THREADS=1 per process unless it is set; with several threads on a loaded machine MKL may use
fewer than asked): thread count changes rounding, and a relaxed acceptance test (lantern) can then take
another branch even under greedy decoding. Batch shape changes rounding too
(CPU and GPU matrix kernels do not promise otherwise): under sampling, a logit that moves in its last bits
moves a token whose uniform draw sits on a CDF boundary (bundled image model, CPU, temperature 1: about one
image in ten differs somewhere between batch 1 and batch 4, plain AR included; in float64, none). Batch-
invariant kernels would close this; until then, compare sampled runs by distribution, not bytes.

Where the plugin's decoder supports it (`Pipeline.continuous_batching_blocker`), a decode call takes
REFILL_WINDOW batches' worth of samples and keeps --batch-size rows busy: a finished row's place goes to
the next waiting sample at once, so ragged acceptance does not leave the batch half empty. The run says at
its start whether this is on, and why not where it is off.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .manifest import (ID_PATTERN, RESERVED_FIELDS, Sample, check_lines, path_field,  # noqa: F401
                       read_manifest, text_field)
from .batch_call import file_digest, finished_record, generate_batch, summed_stats, write_atomic, write_json_atomic
from .pipeline import BatchProgress
from .stats import DecodeStats

# With continuous batching, one decode call takes this many batches' worth of samples and keeps
# --batch-size rows busy until the last few; each sample is written as it finishes.
REFILL_WINDOW = 8


def check_inputs(pipeline, samples: list[Sample], manifest: Path) -> None:
    """Each sample's fields through the pipeline's `batch_input` (no model work); every bad line is named, with
    its line number, in one error (`check_lines`)."""
    allowed = pipeline.batch_fields
    if not allowed:
        raise NotImplementedError(f"{type(pipeline).__name__} does not support `mmspec batch`")
    errors = []
    for sample in samples:
        unknown = sorted(set(sample.fields) - set(allowed))
        where = f"{manifest.name} line {sample.line}"
        if unknown:
            fields = ", ".join(f"'{k}' ({v})" for k, v in allowed.items())
            errors.append(f"{where}: unknown field {unknown[0]!r}; a {type(pipeline).__name__} line takes "
                          f"{fields}, plus optional 'id' and 'seed'")
            continue
        try:
            sample.input = pipeline.batch_input(sample.fields, manifest.parent)
        except (ValueError, FileNotFoundError) as exc:
            errors.append(f"{where}: {exc}")
    check_lines(errors)


def remove_stale_temporaries(out: Path) -> None:
    """Delete the temporary files a killed run left half-written (`write_atomic`'s `.NAME.PID.tmp.EXT`); called
    as a run starts, before any of its processes writes."""
    for path in (out / "samples").glob(".*.tmp*"):
        path.unlink(missing_ok=True)


def check_out_folder(out: Path, config: dict) -> None:
    """A resumed run must be the same job: same plugin, model, settings and manifest."""
    path = out / "batch.json"
    if path.exists():
        before = json.loads(path.read_text())
        for key in sorted(set(before) | set(config)):
            if before.get(key) != config.get(key):
                raise ValueError(f"--out {str(out)!r} holds a batch with another {key} ({before.get(key)!r}, "
                                 f"now {config.get(key)!r}); use a new --out folder to keep both")


def build_pipeline(plugin: str, model: str | None, config: dict, device: str):
    """The bundled pipeline `model` decoding with `plugin` (its `config`): what each process or actor runs."""
    from .loading import default_pipeline
    from .registry import get_plugin_class

    plugin_cls = get_plugin_class(plugin)
    return plugin_cls(**config).attach(default_pipeline(plugin_cls, model=model, device=device))


# --- the whole job ------------------------------------------------------------------------------------

def run_local(pipeline, todo: list[Sample], out: Path, call: dict, batch_size: int, log_path: Path,
              show_progress: bool, refill: bool) -> int:
    """Generate `todo` in this process, `batch_size` rows at a time (refill: continuous batching over calls
    of REFILL_WINDOW batches); returns the samples written. Progress: a bar on a terminal, else a line per
    call on stderr (`BatchProgress`), so a run logged to a file shows how far it got."""
    done, per_call = 0, batch_size * (REFILL_WINDOW if refill else 1)
    batches = -(-len(todo) // per_call)
    with BatchProgress("mmspec batch", batches, len(todo), "sample", disable=not show_progress) as bar, \
            open(log_path, "a") as log_file:

        def log(line: dict) -> None:
            log_file.write(json.dumps(line) + "\n")
            log_file.flush()

        for number, start in enumerate(range(0, len(todo), per_call)):
            chunk = todo[start:start + per_call]
            generate_batch(pipeline, chunk, out, call, batch_size if refill else None, log=log, call_id=str(number))
            done += len(chunk)
            bar.update(len(chunk))
    return done


def read_run_logs(out: Path) -> tuple[DecodeStats, list[dict]]:
    """The statistics of every finished decode call of every run, summed (a line cut by a crash is skipped), and
    one summary per run file: the samples it wrote (sample lines, a killed call's included) and its seconds (a
    killed call's up to its last written sample)."""
    total, runs = DecodeStats(), []
    for path in sorted((out / "runs").glob("*.jsonl")):
        samples, call_seconds, sample_seconds = 0, {}, {}
        for text in path.read_text().splitlines():
            try:
                line = json.loads(text)
            except json.JSONDecodeError:
                continue
            if "sample" in line:
                samples += 1
                key = line.get("call")
                sample_seconds[key] = max(sample_seconds.get(key, 0.0), line["seconds"])
                continue
            stats = DecodeStats(**{k: v for k, v in line["stats"].items() if k in DecodeStats.__dataclass_fields__})
            total = total.merge(stats)
            call_seconds[line.get("call")] = line["seconds"]
        unfinished = [v for k, v in sample_seconds.items() if k not in call_seconds]  # calls a kill cut short
        runs.append({"log": path.name, "samples": samples,
                     "seconds": round(sum(call_seconds.values()) + sum(unfinished), 3),
                     **({"unfinished_calls": len(unfinished)} if unfinished else {})})
    return total, runs


def write_results(out: Path, samples: list[Sample], config: dict, refill_blocker: str | None) -> dict:
    """manifest.jsonl (every record, input order) and summary.json; raises if a sample is unfinished."""
    records = [finished_record(out, s) for s in samples]
    missing = [s.id for s, r in zip(samples, records) if r is None]
    if missing:
        raise RuntimeError(f"{len(missing)} samples are not finished (first: {missing[0]!r}); run the same "
                           "command again to complete them")
    write_atomic(out / "manifest.jsonl",
                 lambda p: p.write_text("".join(json.dumps(r) + "\n" for r in records)))
    own = [r["stats"] for r in records if "target_forwards" in r["stats"]]
    forwards = sum(s["target_forwards"] for s in own)
    committed = sum(s["tokens_committed"] for s in own)
    compute, runs = read_run_logs(out)
    summary = {**config, "samples": len(records), "continuous_batching": refill_blocker is None,
               **({} if refill_blocker is None else {"continuous_batching_off_because": refill_blocker}),
               "per_sample": {"samples_with_own_statistics": len(own), "target_forwards": forwards,
                              "tokens_committed": committed,
                              "mean_accepted": round(committed / max(1, forwards), 4),
                              "nfe_per_sample": round(forwards / max(1, len(own)), 4)},
               "compute": summed_stats(compute), "runs": runs}
    write_json_atomic(out / "summary.json", summary)
    return summary


def run_batch(pipeline, *, plugin: str, model: str | None, inputs: str | os.PathLike, out: str | os.PathLike,
              call: dict, config: dict, batch_size: int = 8, seed: int = 0, engine: str = "local",
              engine_options: dict | None = None, process_state=None, progress: bool = True) -> dict | None:
    """Run a whole manifest (see the module docstring); returns the summary on the main process.

    process_state: an `accelerate.PartialState` (None: made here, which also works without a launcher)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"--batch-size must be an int >= 1, got {batch_size!r}")
    if engine not in ("local", "ray"):
        raise ValueError(f"--engine must be one of ['local', 'ray'], got {engine!r}")
    manifest = Path(inputs)
    samples = read_manifest(manifest, seed)
    check_inputs(pipeline, samples, manifest)
    out = Path(out)
    job = {"plugin": plugin, "model": model, "pipeline": type(pipeline).__name__, "settings": call,
           "plugin_config": config, "seed": seed, "manifest_sha256": file_digest(manifest)}
    check_out_folder(out, job)
    blocker = pipeline.continuous_batching_blocker()

    if process_state is None:
        from accelerate import PartialState

        process_state = PartialState()
    if process_state.is_main_process:
        write_json_atomic(out / "batch.json", job)
        remove_stale_temporaries(out)
        if progress:
            import sys

            print("mmspec batch: continuous batching " + ("on" if blocker is None else f"off: {blocker}"),
                  file=sys.stderr)
    process_state.wait_for_everyone()
    todo = [s for s in samples if finished_record(out, s) is None]
    run_name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    (out / "runs").mkdir(parents=True, exist_ok=True)
    if engine == "ray":
        if process_state.num_processes > 1:
            raise ValueError("--engine ray runs its own workers: launch it as one process, not with accelerate")
        from functools import partial

        from .batch_ray import run_ray

        options = dict(engine_options or {})
        device = options.pop("device", "cpu")
        run_ray(todo, out, call, batch_size, out / "runs" / f"{run_name}.ray.jsonl",
                make_pipeline=partial(build_pipeline, plugin, model, config, device), base_dir=manifest.parent,
                device=device, refill=blocker is None,
                per_call=batch_size * (REFILL_WINDOW if blocker is None else 1), **options)
    else:
        with process_state.split_between_processes(todo) as mine:
            log = out / "runs" / f"{run_name}.rank{process_state.process_index}.jsonl"
            run_local(pipeline, mine, out, call, batch_size, log, progress and process_state.is_main_process,
                      refill=blocker is None)
    process_state.wait_for_everyone()
    if not process_state.is_main_process:
        return None
    return write_results(out, samples, job, blocker)
