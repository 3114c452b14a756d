"""`mmspec bench`: plain AR and a plugin on the same model, inputs, seeds and device, in one process.

The JSON written here is a contract that later tools parse; keep its keys stable:
plugin, pipeline, model, device, num_samples, batch_size, seed, lossless, settings, config,
baseline{nfe_per_sample, latency_s_per_sample, quality{}},
accelerated{nfe_per_sample, latency_s_per_sample, mean_accepted, acceptance_per_position[], quality{}},
step_compression (null when the plugin needs no target forward), speedup, exact_match_rate (null unless
greedy), comparison{} (the pipeline's own AR-vs-plugin comparisons), peer (null or {...}),
quality_cost{metric: {delta, low, high, n}} (plugin − AR with a paired-bootstrap 95 % interval, for the
metrics the pipeline scores per sample; rows written before it have none).

Nothing here knows a modality: the pipeline gives the inputs, runs them, scores them, adds its own summary
fields (`bench_summary`) and its own BENCHMARKS.md sections (`bench_sections`).
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict

import torch

from .config import split_settings as config_split_settings
from .loading import default_pipeline
from .registry import get_plugin_class


def run_peer(model, name: str, inputs: list, generate_one) -> dict:
    """A peer implementation's bench entry, run one input at a time: `generate_one(index, input)` returns that
    input's generated ids; `model`'s forward calls and the wall-clock are counted."""
    calls = {"n": 0}
    hook = model.register_forward_hook(lambda *_: calls.__setitem__("n", calls["n"] + 1))
    sequences, start = [], time.perf_counter()
    try:
        for i, item in enumerate(inputs):
            sequences.append(generate_one(i, item))
    finally:
        hook.remove()
    elapsed = time.perf_counter() - start
    return {"name": name, "batch_size": 1, "nfe_per_sample": calls["n"] / len(inputs),
            "latency_s_per_sample": elapsed / len(inputs), "sequences": sequences}


def cut_after(ids: list[int], eos: int | None) -> list[int]:
    """Generated ids up to and including the first EOS (`generate` pads finished rows with it)."""
    return ids[: ids.index(eos) + 1] if eos is not None and eos in ids else ids


def split_settings(pipeline, plugin_cls, settings: dict, bench: bool = False) -> tuple[dict, dict]:
    """Split `--set` values into pipeline call settings and plugin config (with `bench`, also the pipeline's
    bench-only settings, which its `bench_generate` consumes)."""
    call_defaults = {**pipeline.call_defaults, **(pipeline.bench_settings if bench else {})}
    return config_split_settings(call_defaults, plugin_cls.Config, plugin_cls.name, settings)


def interleaved_runs(pipes, inputs, batch_size, seed, call, rotate: bool = False):
    """Run the pipelines (e.g. AR and a plugin) batch by batch, alternating, so machine-load drift hits all
    alike. One (sequences, stats, seconds) per pipeline, in order. rotate: the order in which they take a
    batch turns from batch to batch, so with many pipelines none always runs first or last in a round."""
    from .stats import DecodeStats

    runs = [([], DecodeStats(), 0.0) for _ in pipes]
    starts = range(0, len(inputs), batch_size)
    for round_, start in enumerate(starts):
        chunk = inputs[start:start + batch_size]
        shift = round_ * len(pipes) // len(starts) if rotate else 0
        for i in [(j + shift) % len(pipes) for j in range(len(pipes))]:
            pipe = pipes[i]
            begin = time.perf_counter()
            sequences, stats = pipe.bench_generate(chunk, batch_size, seed + start, call)
            seqs, total, elapsed = runs[i]
            runs[i] = (seqs + sequences, total.merge(stats), elapsed + time.perf_counter() - begin)
    return runs


def bench_environment(device: str) -> dict:
    """What a bench row ran on: torch and Python versions, CPU threads, the GPU's name (None on a CPU)."""
    return {"torch": torch.__version__, "python": platform.python_version(), "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None}


def _warm_up(pipes, inputs, batch_size, seed, call, compiled: bool) -> float:
    """Run each pipeline once before timing so one-off costs land on neither side: one input, or with compiled
    forwards one full batch (it compiles the batch and draft-width buckets the timed run meets). Seconds."""
    begin = time.perf_counter()
    count = batch_size if compiled else 1
    for pipe in pipes:
        pipe.bench_generate(inputs[:count], count, seed, call)
    return time.perf_counter() - begin


def _summary(stats, latency, num_samples, quality, extra: dict) -> dict:
    return {**extra, "nfe_per_sample": stats.nfe_per_sample, "latency_s_per_sample": latency / num_samples,
            "tokens_per_sample": stats.tokens / num_samples, "mean_accepted": stats.mean_accepted,
            "acceptance_per_position": stats.acceptance_per_position, "target_nfe": stats.target_nfe,
            "drafter_nfe": stats.drafter_nfe, "target_width": stats.target_width / max(1, stats.target_nfe),
            "time_split_s": {"draft": stats.time_draft_s, "verify": stats.time_verify_s,
                             "accept": stats.time_accept_s, "prefill": stats.time_prefill_s,
                             "total": stats.time_total_s},
            "quality": quality,
            **({"tree_node_accepts": stats.tree_node_accepts} if stats.tree_node_accepts else {})}


def _exact_match(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x == y for x, y in zip(a, b)) / max(1, len(a))


DTYPES = ("float32", "bfloat16")


def cast_pipeline(pipeline, dtype: str) -> None:
    """Run the pipeline's models in `dtype` (one of DTYPES), or say in one line why it cannot."""
    if dtype == "float32":
        return
    to = getattr(pipeline, "to", None)
    if to is None:
        raise ValueError(f"dtype={dtype!r}: {type(pipeline).__name__} cannot cast its models (it has no "
                         ".to(dtype)); use dtype='float32'")
    to(getattr(torch, dtype))


def run_bench(plugin: str, model: str | None = None, num_samples: int | None = None, batch_size: int = 1,
              seed: int = 0, device: str = "cpu", settings: dict | None = None, progress=print,
              dtype: str = "float32", compile=None) -> dict:
    """One bench row: AR and the plugin on the same inputs, batch by batch, alternating. compile: run both
    with compiled step forwards (`Pipeline.enable_compile`; see `run_compile_bench` for compiled vs eager)."""
    from .compiled import as_compile_settings

    compile = as_compile_settings(compile)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    plugin_cls = get_plugin_class(plugin)
    baseline_cls = get_plugin_class("ar")
    pipeline = default_pipeline(plugin_cls, model=model, device=device)
    call, config = split_settings(pipeline, plugin_cls, settings or {}, bench=True)
    accelerated = plugin_cls(**config)
    cast_pipeline(pipeline, dtype)
    pipeline.enable_compile(compile)
    num_samples = num_samples or pipeline.bench_num_samples
    inputs = pipeline.bench_inputs(num_samples, seed, **{k: call[k] for k in pipeline.bench_input_settings})
    greedy = call.get("temperature", 0.0) == 0

    base_pipe, acc_pipe = baseline_cls().attach(pipeline), accelerated.attach(pipeline)
    _warm_up((base_pipe, acc_pipe), inputs, batch_size, seed, call, compile is not None)

    progress(f"[bench] {plugin}: ar and {plugin} on {num_samples} samples, batch {batch_size}"
             + (" (compiled forwards)" if compile is not None else ""))
    (base_seq, base_stats, base_time), (acc_seq, acc_stats, acc_time) = interleaved_runs(
        (base_pipe, acc_pipe), inputs, batch_size, seed, call)
    peer = accelerated.bench_peer(pipeline, inputs, call)
    if peer is not None:
        peer_seq = peer.pop("sequences", None)
        if peer_seq is not None and greedy:
            peer["exact_match_rate_vs_ar"] = _exact_match(peer_seq, base_seq)

    from .stats import paired_bootstrap, split_quality

    base_quality, base_parts = split_quality(pipeline.bench_quality(inputs, base_seq))
    acc_quality, acc_parts = split_quality(pipeline.bench_quality(inputs, acc_seq))
    result = {
        "plugin": plugin,
        "pipeline": pipeline.pipeline_name,
        "model": pipeline.model_name or model,
        "device": device,
        "dtype": dtype,
        "compile": None if compile is None else asdict(compile),
        "num_samples": num_samples,
        "batch_size": batch_size,
        "seed": seed,
        "lossless": bool(getattr(accelerated, "lossless", plugin_cls.lossless)),  # a mode may change it
        "settings": call,
        "config": asdict(accelerated.config),
        "baseline": _summary(base_stats, base_time, num_samples, base_quality,
                             pipeline.bench_summary(inputs, base_stats, base_time)),
        "accelerated": _summary(acc_stats, acc_time, num_samples, acc_quality,
                                pipeline.bench_summary(inputs, acc_stats, acc_time)),
        # plugin − AR per metric with a paired-bootstrap 95 % interval (0 inside: noise can explain it)
        "quality_cost": paired_bootstrap(base_parts, acc_parts, seed=seed),
        # None when the plugin ran no target forward at all (e.g. CTC-only transcripts): no finite ratio.
        "step_compression": (base_stats.nfe_per_sample / acc_stats.nfe_per_sample
                             if acc_stats.nfe_per_sample > 0 else None),
        "speedup": base_time / max(acc_time, 1e-9),
        "exact_match_rate": _exact_match(acc_seq, base_seq) if greedy else None,
        "comparison": pipeline.bench_compare(inputs, base_seq, acc_seq),
        "peer": peer,
        "environment": bench_environment(device),
    }
    return result


def run_compile_bench(plugin: str, model: str | None = None, num_samples: int | None = None, batch_size: int = 1,
                      seed: int = 0, device: str = "cpu", settings: dict | None = None, compile=True,
                      progress=print) -> dict:
    """`mmspec bench PLUGIN --compile`: AR and the plugin, each eager and with compiled step forwards, batch by
    batch, alternating (four sides). Row keys (`kind: "compile"`): plugin, model, device, num_samples,
    batch_size, seed, settings, config, compile (the settings), warm_up_s (compiling included), seconds
    {ar, ar_compiled, plugin, plugin_compiled}, compiled_while_timed (graphs compiled inside the timed run),
    compile_gain {ar, plugin} (eager s / compiled s), speedup
    {eager, compiled} (AR s / plugin s on each side), identical_outputs {ar, plugin} (share of compiled outputs
    equal to eager ones; greedy only, else None), environment."""
    from .compiled import as_compile_settings

    compile = as_compile_settings(compile)
    if compile is None:
        raise ValueError("compile must name compiled forwards to compare with eager ones (e.g. True), got "
                         f"{compile!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"--batch-size must be an int >= 1, got {batch_size!r}")
    plugin_cls = get_plugin_class(plugin)
    pipeline = default_pipeline(plugin_cls, model=model, device=device)
    call, config = split_settings(pipeline, plugin_cls, settings or {}, bench=True)
    accelerated = plugin_cls(**config)
    num_samples = num_samples or pipeline.bench_num_samples
    inputs = pipeline.bench_inputs(num_samples, seed, **{k: call[k] for k in pipeline.bench_input_settings})
    ar, ar_compiled = get_plugin_class("ar")().attach(pipeline), get_plugin_class("ar")().attach(pipeline)
    acc, acc_compiled = accelerated.attach(pipeline), accelerated.attach(pipeline)
    for pipe in (ar_compiled, acc_compiled):
        pipe.enable_compile(compile)
    warm = _warm_up((ar, acc, ar_compiled, acc_compiled), inputs, batch_size, seed, call, True)
    progress(f"[bench] {plugin}: ar and {plugin}, eager and compiled, on {num_samples} samples, batch {batch_size}")
    compiled_before = _compiled_graphs()
    runs = interleaved_runs((ar, acc, ar_compiled, acc_compiled), inputs, batch_size, seed, call)
    compiled_while_timed = _compiled_graphs() - compiled_before
    (ar_seq, _, ar_s), (acc_seq, _, acc_s), (arc_seq, _, arc_s), (accc_seq, _, accc_s) = runs
    greedy = call.get("temperature", 0.0) == 0
    return {
        "kind": "compile", "plugin": plugin, "pipeline": pipeline.pipeline_name, "model": pipeline.model_name or model,
        "device": device, "num_samples": num_samples, "batch_size": batch_size, "seed": seed, "settings": call,
        "config": asdict(accelerated.config), "compile": asdict(compile), "warm_up_s": warm,
        # Graphs compiled inside the timed run (shape buckets the warm-up batch did not meet): their compile
        # time is in the compiled sides' seconds.
        "compiled_while_timed": compiled_while_timed,
        "seconds": {"ar": ar_s, "ar_compiled": arc_s, "plugin": acc_s, "plugin_compiled": accc_s},
        "compile_gain": {"ar": ar_s / max(arc_s, 1e-9), "plugin": acc_s / max(accc_s, 1e-9)},
        "speedup": {"eager": ar_s / max(acc_s, 1e-9), "compiled": arc_s / max(accc_s, 1e-9)},
        "identical_outputs": ({"ar": _exact_match(arc_seq, ar_seq), "plugin": _exact_match(accc_seq, acc_seq)}
                              if greedy else None),
        "environment": bench_environment(device),
    }


def _compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
