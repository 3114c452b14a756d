"""`mmspec batch --engine ray`: the same per-sample work as the local engine, as a Ray Data pipeline.

    samples --from_items--> map_batches(BatchWorker, an actor pool) --> the run-log lines of each call

Each actor builds its own pipeline once (from the plugin, model and settings, not a pickled copy of the
driver's) and writes outputs and records exactly as the local engine does (`mmspec.common.batch_call`), so the files,
the done-markers and resume are the same as with the local engine. On CPU every actor asks for a fraction of
a CPU: with Ray's default of one CPU per actor, a 2-core machine deadlocks (Ray Data's own tasks need one
too). On GPU each actor asks for one GPU. An actor writes each sample's files as it finishes; its run-log lines
come back to the driver with its call, so a killed Ray run keeps its samples but logs only its finished calls.

Ray runs in local mode when no cluster is running (`ray.init()` starts one in this process); on a cluster,
start the driver where `ray.init(address="auto")` finds it (set RAY_ADDRESS) and the --out folder is on a
file system every node shares.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .batch_call import generate_batch
from .manifest import Sample


class BatchWorker:
    """One Ray actor: a pipeline built once, then one `generate_batch` per incoming batch."""

    def __init__(self, make_pipeline, out: str, call: dict, base_dir: str, max_batch_size: int | None):
        self.pipeline = make_pipeline()
        self.out, self.call, self.base_dir = Path(out), call, Path(base_dir)
        self.max_batch_size = max_batch_size
        self.calls = 0

    def __call__(self, batch: dict) -> dict:
        samples = []
        for text in batch["sample"]:
            fields = json.loads(text)
            sample = Sample(**fields)
            sample.input = self.pipeline.batch_input(sample.fields, self.base_dir)
            samples.append(sample)
        lines = []  # the driver writes the run log: a sample line per sample, then the call's line
        self.calls += 1
        generate_batch(self.pipeline, samples, self.out, self.call, self.max_batch_size, log=lines.append,
                       call_id=f"{os.getpid()}-{self.calls}")
        return {"line": [json.dumps(line) for line in lines]}


def run_ray(todo: list[Sample], out: Path, call: dict, batch_size: int, log_path: Path, *,
            make_pipeline, base_dir: Path, per_call: int, num_workers: int = 2, device: str = "cpu",
            cpus_per_worker: float = 0.5, refill: bool = False) -> int:
    """Generate `todo` (inputs already checked by the driver's pipeline) on a Ray actor pool, `per_call`
    samples per decode call (`batch_size` rows at once with refill); returns the samples written. The actors
    build their pipelines with `make_pipeline` (picklable, no arguments)."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise ValueError("--engine ray needs Ray Data: pip install 'mmspec[dist]' (or 'ray[data]')") from None

    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"--ray-workers must be an int >= 1, got {num_workers!r}")
    if not todo:
        return 0
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    items = [{"sample": json.dumps({"index": s.index, "line": s.line, "id": s.id, "seed": s.seed,
                                    "fields": s.fields})} for s in todo]
    resources = {"num_gpus": 1} if device == "cuda" else {"num_cpus": cpus_per_worker}
    dataset = ray.data.from_items(items).map_batches(
        BatchWorker, fn_constructor_kwargs={"make_pipeline": make_pipeline, "out": str(out), "call": call,
                                            "base_dir": str(base_dir),
                                            "max_batch_size": batch_size if refill else None},
        batch_size=per_call, concurrency=num_workers, batch_format="numpy", **resources)
    written = 0
    with open(log_path, "a") as log:
        for row in dataset.iter_rows():
            log.write(row["line"] + "\n")
            log.flush()
            written += "sample" in json.loads(row["line"])
    return written
