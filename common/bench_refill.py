"""`mmspec bench PLUGIN --refill`: samples/s of one plugin with and without continuous batching.

The same inputs, seeds and plugin run twice at --batch-size rows: in batches one after another (a batch
ends when its slowest row does, so ragged acceptance leaves rows idle at its tail), and as one call with
max_batch_size = --batch-size (a finished row's place goes to the next waiting input at once). Rounds
alternate the two so machine-load drift hits both; each side's time is its fastest round. Every input
draws from its own generator, so greedy outputs must be identical; sampled outputs are identical up to
float rounding that depends on the batch's shape (the row counts the outputs that differ).

Row keys (a `kind: "refill"` entry of the bench JSON): plugin, pipeline, model, device, num_samples,
batch_size, seed, settings, config, rounds, batches{...}, refill{...} (seconds, samples_per_s,
target_forwards, occupancy = row-steps / (forwards x batch size), admitted_rows), gain (refill samples/s over
batches'), identical_outputs, differing_outputs, environment.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from .bench_run import bench_environment, split_settings
from .loading import default_pipeline
from .registry import get_plugin_class

REFILL_ROWS = ({"plugin": "sjd"}, {"plugin": "lantern"}, {"plugin": "speculative"},  # what `--all` measures
               # a batch of utterances decodes in about a second here: 96 clips keep the row above timer noise
               {"plugin": "ctc_draft", "num_samples": 96},
               {"plugin": "ctc_draft", "num_samples": 96, "settings": {"test_set": "out_of_domain"}})


def run_refill_bench(plugin: str, model: str | None = None, num_samples: int | None = None, batch_size: int = 8,
                     seed: int = 0, device: str = "cpu", settings: dict | None = None, rounds: int = 2,
                     progress=print) -> dict:

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 2:
        raise ValueError(f"--batch-size must be an int >= 2 for --refill (one row has no tail to fill), "
                         f"got {batch_size!r}")
    plugin_cls = get_plugin_class(plugin)
    pipeline = default_pipeline(plugin_cls, model=model, device=device)
    call, config = split_settings(pipeline, plugin_cls, settings or {}, bench=True)
    pipe = plugin_cls(**config).attach(pipeline)
    blocker = pipe.continuous_batching_blocker()
    if blocker is not None:
        raise ValueError(f"plugin {plugin!r} on {pipeline.model_name}: no continuous batching ({blocker})")
    num_samples = num_samples or 4 * batch_size
    if num_samples <= batch_size:
        raise ValueError(f"--num-samples must exceed --batch-size for --refill, got {num_samples} <= {batch_size}")
    input_settings = {k: call[k] for k in pipe.bench_input_settings}  # which inputs (e.g. a test set)
    inputs = pipe.bench_inputs(num_samples, seed, **input_settings)
    pipe.bench_generate(inputs[:2], 2, seed, {**call, "max_batch_size": 1})  # warm-up, both code paths

    def batches():
        return pipe.bench_generate(inputs, batch_size, seed, call)

    def refill():
        return pipe.bench_generate(inputs, num_samples, seed, {**call, "max_batch_size": batch_size})

    progress(f"[bench] {plugin}: {num_samples} samples at batch {batch_size}, batches vs continuous batching")
    seconds, outputs = {"batches": [], "refill": []}, {}
    for _ in range(rounds):
        for name, run in (("batches", batches), ("refill", refill)):
            begin = time.perf_counter()
            outputs[name] = run()
            seconds[name].append(time.perf_counter() - begin)

    def side(name):
        sequences, stats = outputs[name]
        best = min(seconds[name])
        return {"seconds": best, "samples_per_s": num_samples / best, "target_forwards": stats.target_nfe,
                "occupancy": stats.row_steps / max(1, stats.target_nfe * batch_size),
                "admitted_rows": int(stats.extra.get("admitted_rows", 0)), "seconds_per_round": seconds[name]}

    result = {
        "kind": "refill", "plugin": plugin, "pipeline": pipeline.pipeline_name, "model": pipeline.model_name or model,
        "device": device, "num_samples": num_samples, "batch_size": batch_size, "seed": seed, "settings": call,
        "config": asdict(pipe.plugin.config), "input_settings": input_settings, "rounds": rounds,
        "batches": side("batches"), "refill": side("refill"),
        "identical_outputs": outputs["batches"][0] == outputs["refill"][0],
        "differing_outputs": sum(a != b for a, b in zip(outputs["batches"][0], outputs["refill"][0])),
        "environment": bench_environment(device),
    }
    result["gain"] = result["refill"]["samples_per_s"] / result["batches"]["samples_per_s"]
    return result


def format_refill_table(rows: list[dict]) -> str:
    lines = ["| plugin | model | batch | samples | samples/s (batches → refill) | gain | target forwards | "
             "row occupancy | identical outputs |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b, f = r["batches"], r["refill"]
        inputs = ", ".join(f"{k}={v}" for k, v in r.get("input_settings", {}).items())
        name = f"{r['plugin']} ({inputs})" if inputs else r["plugin"]
        lines.append(f"| {name} | {r['model']} | {r['batch_size']} | {r['num_samples']} | "
                     f"{b['samples_per_s']:.2f} → {f['samples_per_s']:.2f} | {r['gain']:.2f}× | "
                     f"{b['target_forwards']} → {f['target_forwards']} | "
                     f"{b['occupancy']:.0%} → {f['occupancy']:.0%} | "
                     f"{'yes' if r['identical_outputs'] else _differ_text(r)} |")
    return "\n".join(lines)


def _differ_text(r: dict) -> str:
    text = f"{r['differing_outputs']} of {r['num_samples']} differ"
    return text + " (sampled: float batch variance)" if r["settings"].get("temperature", 0) > 0 else "**" + text + "**"


REFILL_INTRO = ("Continuous batching (`max_batch_size=`, used by `mmspec batch`): the same inputs and seeds in "
                "batches one after another vs one call that keeps the batch full, refilling a finished row's "
                "place with the next input. Row occupancy = rows decoding per forward / batch size. Fastest of "
                "the alternated rounds per side. Greedy outputs must be identical; sampled ones are identical "
                "up to float rounding that depends on the batch's shape (a token whose uniform draw sits on a "
                "CDF boundary can move; in float64 the same runs are identical).")
