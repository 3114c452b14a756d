"""One decode call of `mmspec batch` and the files it writes: each sample's output and record, written atomically
the moment the pipeline hands the sample on (`generate_batch`), and the run-log lines. Shared by the local engine
(`mmspec.common.batch`) and the Ray engine (`mmspec.common.batch_ray`)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from .manifest import Sample
from .stats import DecodeStats


# --- files ------------------------------------------------------------------------------------------

def write_atomic(path: Path, write) -> None:
    """Call write(temporary_path), then rename it to `path`: readers see the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def write_json_atomic(path: Path, value) -> None:
    write_atomic(path, lambda p: p.write_text(json.dumps(value, indent=2) + "\n"))


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record_path(out: Path, sample: Sample) -> Path:
    return out / "samples" / f"{sample.id}.json"


def finished_record(out: Path, sample: Sample) -> dict | None:
    """The sample's record when the sample is completely written (record and output with its digest)."""
    try:
        record = json.loads(record_path(out, sample).read_text())
        output = out / record["output"]
        return record if output.is_file() and file_digest(output) == record["sha256"] else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


# --- one batch ----------------------------------------------------------------------------------------

def generate_batch(pipeline, samples: list[Sample], out: Path, call: dict, max_batch_size: int | None = None,
                   log=None, call_id: str = "0") -> DecodeStats:
    """One decode call over `samples`, each written the moment the pipeline hands it on (`batch_generate`; with
    continuous batching, as its rows finish): its run-log line, then its output, then its record (which marks it
    done), so a crash loses only the samples still decoding. Then the call's own run-log line, with its
    statistics. max_batch_size: rows decoded at once by continuous batching (None: the whole batch at once).
    log(line): writes one run-log line (a dict); call_id names this call in them."""
    import torch

    generators = [torch.Generator().manual_seed(s.seed) for s in samples]
    if max_batch_size is not None and max_batch_size < len(samples):
        call = {**call, "max_batch_size": max_batch_size}
    begin = time.perf_counter()
    written = [False] * len(samples)

    def write_sample(position: int, output, statistics: dict) -> None:
        if not 0 <= position < len(samples) or written[position]:
            raise RuntimeError(f"{type(pipeline).__name__}.batch_generate handed on sample {position} twice or out "
                               f"of range (the call has {len(samples)})")
        sample = samples[position]
        if log is not None:  # first: a crash while its files are written must not hide the compute they took
            log({"sample": sample.id, "call": call_id, "seconds": round(time.perf_counter() - begin, 4)})
        name = Path("samples") / f"{sample.id}{pipeline.batch_suffix}"
        write_atomic(out / name, lambda p: pipeline.batch_write(output, p))
        record = {"id": sample.id, "index": sample.index, "inputs": sample.fields, "seed": sample.seed,
                  "output": name.as_posix(), "sha256": file_digest(out / name), "stats": statistics}
        write_json_atomic(record_path(out, sample), record)
        written[position] = True

    stats = pipeline.batch_generate([s.input for s in samples], generators, call, write_sample)
    missing = [s.id for s, done in zip(samples, written) if not done]
    if missing:
        raise RuntimeError(f"{type(pipeline).__name__}.batch_generate handed on {len(samples) - len(missing)} of "
                           f"{len(samples)} samples (first missing: {missing[0]!r})")
    if log is not None:
        log(call_line(stats, samples, time.perf_counter() - begin, call_id))
    return stats


def summed_stats(stats: DecodeStats) -> dict:
    """`stats.to_dict()` without the per-row lists (the records hold them per sample)."""
    out = stats.to_dict()
    for name in ("row_forwards", "row_committed"):
        out.pop(name)
    return out


def call_line(stats: DecodeStats, samples: list[Sample], seconds: float, call_id: str) -> dict:
    """A decode call's run-log line: its samples, time and statistics (its samples have a line each too)."""
    return {"ids": [s.id for s in samples], "call": call_id, "seconds": round(seconds, 4),
            "stats": summed_stats(stats)}
