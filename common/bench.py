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

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .registry import (bundled_model_info, bundled_models, get_pipeline_class, get_plugin_class, list_pipelines,
                       list_plugins)
from .config import parse_settings  # noqa: F401  (re-exported for the CLI and tests)
from .config import split_settings as config_split_settings


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
    pipeline = plugin_cls.default_pipeline(model=model, device=device)
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
    pipeline = plugin_cls.default_pipeline(model=model, device=device)
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


def format_compile_table(rows: list[dict]) -> str:
    """Markdown table of `run_compile_bench` rows."""
    lines = ["| plugin | model | batch | compile | AR compiled / eager | plugin compiled / eager | "
             "speed-up eager → compiled | identical outputs (AR, plugin) | warm-up s | compiled while timed |",
             "|" + "---|" * 10]
    for r in rows:
        same = r["identical_outputs"]
        backend = r["compile"]["backend"] + (f", {r['compile']['mode']}" if r["compile"]["mode"] else "")
        lines.append(f"| {r['plugin']} | {r['model']} | {r['batch_size']} | {backend} | "
                     f"{r['compile_gain']['ar']:.2f}× | {r['compile_gain']['plugin']:.2f}× | "
                     f"{r['speedup']['eager']:.2f}× → {r['speedup']['compiled']:.2f}× | "
                     + ("—" if same is None else f"{same['ar']:.2f}, {same['plugin']:.2f}")
                     + f" | {r['warm_up_s']:.0f} | {r.get('compiled_while_timed', '—')} |")
    return "\n".join(lines)


def config_text(r: dict) -> str:
    """The row's plugin settings that differ from the plugin's defaults."""
    defaults = asdict(get_plugin_class(r["plugin"]).Config())
    return ", ".join(f"{k}={v}" for k, v in r["config"].items() if defaults.get(k) != v) or "defaults"


def exact_text(r: dict) -> str:
    return "—" if r["exact_match_rate"] is None else f"{r['exact_match_rate']:.2f}"


def sampling_text(settings: dict) -> str:
    """'greedy' or the sampling settings of a row: the logits pipeline's first, then the pipeline's own."""
    order = ["temperature", "top_k", "top_p"] + [k for k in settings if k not in ("temperature", "top_k", "top_p")]
    shown = [f"{k}={settings[k]}" for k in order if k in settings and k != "max_new_tokens"
             and settings[k] is not None and not (k == "temperature" and settings[k] == 0)]
    return ", ".join((["greedy"] if settings.get("temperature", 0) == 0 else []) + shown)


def compression_text(r: dict) -> str:
    """Step compression, or ∞ for a plugin that ran no target forward."""
    return "∞" if r["step_compression"] is None else f"{r['step_compression']:.2f}×"


def pipeline_sections(results: list[dict]) -> list[tuple[str, str, str]]:
    """Each registered pipeline's own BENCHMARKS.md sections, over the rows measured on it."""
    sections = []
    for name in list_pipelines():
        rows = [r for r in results if r.get("pipeline") == name]
        if rows:
            sections += get_pipeline_class(name).bench_sections(rows)
    return sections


def quality_text(row: dict, with_counts: bool) -> str:
    """A bench row's quality figures, AR → plugin, with the interval of the difference (`quality_comparison`)."""
    return quality_comparison(row["baseline"]["quality"], row["accelerated"]["quality"], row.get("quality_cost"),
                              with_counts) or "—"


def quality_comparison(base: dict, acc: dict, costs: dict | None, with_counts: bool = False) -> str:
    """'class_acc 0.85 → 0.83 (−0.02 [−0.06, +0.02])': each figure AR → plugin, with the paired-bootstrap
    interval of the difference where the pipeline scores per sample (an interval holding 0: noise can explain
    the difference)."""
    parts = []
    for key in base:
        if key.startswith("num_") and not with_counts:
            continue
        text = f"{key} {base[key]:.3g} → {acc.get(key, float('nan')):.3g}"
        if costs and key in costs:
            c = costs[key]
            text += f" ({c['delta']:+.2g} [{c['low']:+.2g}, {c['high']:+.2g}])"
        parts.append(text)
    return ", ".join(parts)


def format_compact_table(results: list[dict]) -> str:
    """The figures a reader compares first: speed-up, what it costs in forwards, and quality (`--wide`: all)."""
    rows = ["| plugin | config | model | batch | sampling | speedup | step compr. | mean accepted | exact match | "
            "quality (AR → plugin) |", "|" + "---|" * 10]
    for r in results:
        base, acc = r["baseline"], r["accelerated"]
        quality = quality_text(r, with_counts=False)
        rows.append(f"| {r['plugin']} | {config_text(r)} | {r['model']} | {r['batch_size']} | "
                    f"{sampling_text(r.get('settings', {}))} | {r['speedup']:.2f}× | {compression_text(r)} | "
                    f"{acc['mean_accepted']:.2f} | {exact_text(r)} | {quality} |")
    return "\n".join(rows)


def format_table(results: list[dict]) -> str:
    head = ("| plugin | config | model | lossless | batch | sampling | mean accepted | NFE/sample (AR → plugin) | step compr. | "
            "latency s/sample (AR → plugin) | speedup | exact match | quality (AR → plugin) |")
    rows = [head, "|" + "---|" * 13]
    for r in results:
        base, acc = r["baseline"], r["accelerated"]
        quality = quality_text(r, with_counts=True)
        sampling = sampling_text(r.get("settings", {}))
        rows.append(f"| {r['plugin']} | {config_text(r)} | {r['model']} | {'yes' if r['lossless'] else 'no'} | "
                    f"{r['batch_size']} | "
                    f"{sampling} | "
                    f"{acc['mean_accepted']:.2f} | {base['nfe_per_sample']:.1f} → {acc['nfe_per_sample']:.1f} | "
                    f"{compression_text(r)} | {base['latency_s_per_sample']:.3f} → "
                    f"{acc['latency_s_per_sample']:.3f} | {r['speedup']:.2f}× | {exact_text(r)} | {quality} |")
    return "\n".join(rows)


def format_peers(results: list[dict]) -> str:
    lines = []
    for r in results:
        peer = r.get("peer")
        if not peer:
            continue
        match = peer.get("exact_match_rate_vs_ar")
        lines.append(f"| {r['plugin']} | {peer['name']} (batch {peer['batch_size']}) | "
                     f"{r['accelerated']['nfe_per_sample']:.1f} vs {peer['nfe_per_sample']:.1f} | "
                     f"{r['accelerated']['latency_s_per_sample']:.3f} vs {peer['latency_s_per_sample']:.3f} | "
                     f"{'—' if match is None else f'{match:.2f}'} |")
    if not lines:
        return ""
    return "\n".join(["| plugin | peer | target NFE/sample (ours vs peer) | latency s/sample (ours vs peer) | "
                      "peer exact match vs AR |", "|---|---|---|---|---|"] + lines)


def plugin_rows(results: list[dict]) -> list[dict]:
    """The AR-vs-plugin rows (the bench JSON also holds `kind: "refill"` rows, see `bench_refill`)."""
    return [r for r in results if r.get("kind", "plugin") == "plugin"]


def write_markdown(results: list[dict], path: str | Path, command: str, gpu_report: str | Path | None = None) -> None:
    """BENCHMARKS.md from bench rows. gpu_report: what `examples/gpu_bench.py` wrote (default: a
    benchmarks_gpu.json beside `path`, if there is one), rendered as its "On a GPU" section."""
    from .bench_refill import REFILL_INTRO, format_refill_table

    refills = [r for r in results if r.get("kind") == "refill"]
    results = plugin_rows(results)
    env = results[0]["environment"] if results else {}
    text = [
        "# Benchmarks",
        "",
        f"Generated by `{command}`; do not edit by hand. Device: {results[0]['device'] if results else '?'}, "
        f"torch {env.get('torch')}, {env.get('threads')} threads. Latency is wall-clock per sample at the "
        "stated batch size; NFE/sample counts target forwards a sample takes part in (prompt prefill excluded). "
        "Mean accepted counts tokens committed per target forward, bonus token included (AR = 1.00).",
        "",
        format_table(results),
        "",
    ]
    for title, intro, table in pipeline_sections(results):
        text += [f"## {title}", "", intro, "", table, ""]
    peers = format_peers(results)
    if peers:
        text += ["## Side by side with peer implementations", "", peers, ""]
    if refills:
        text += ["## Continuous batching", "", REFILL_INTRO, "", format_refill_table(refills), ""]
    from .profile import PROFILE_INTRO, format_profile_table

    profile = format_profile_table(results)
    if profile:
        text += ["## Where the time goes", "", PROFILE_INTRO, "", profile, ""]
    gpu_path = Path(gpu_report) if gpu_report is not None else Path(path).with_name("benchmarks_gpu.json")
    if gpu_path.exists():
        from .gpu_report import format_gpu_section

        text += ["## On a GPU", "", format_gpu_section(json.loads(gpu_path.read_text())), ""]
    text += ["## Acceptance per draft position", ""]
    for r in results:
        acc = r["accelerated"]["acceptance_per_position"]
        if acc:
            text.append(f"- `{r['plugin']}` batch {r['batch_size']}, {r['settings']}, {r['config']}: "
                        + ", ".join(f"{a:.2f}" for a in acc))
    Path(path).write_text("\n".join(text) + "\n")


# Extra rows `--all` adds per plugin beyond its defaults: ragged batches and sampling.
ALL_VARIANTS = ({"batch_size": 1}, {"batch_size": 4}, {"batch_size": 1, "settings": {"temperature": 1.0}})


def run_all(markdown: str | Path | None, json_path: str | Path | None, device: str = "cpu", seed: int = 0,
            progress=print, only: list[str] | None = None) -> list[dict]:
    """Every plugin's rows (`ar` = the bundled models' own rows). With `only`, just those plugins' rows are
    run, and they replace the same plugins' rows of an existing `json_path`; the rest is kept as it was."""
    known = list_plugins()
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise ValueError(f"unknown plugin(s) {unknown} for --only; valid: {known}")
    selected = [name for name in known if only is None or name in only]
    results = []
    if only is not None and json_path and Path(json_path).exists():
        results = [r for r in json.loads(Path(json_path).read_text()) if r["plugin"] not in selected]
    order = {name: i for i, name in enumerate(known)}

    def add(row: dict) -> None:
        results.append(row)
        results.sort(key=lambda r: order.get(r["plugin"], len(order)))  # stable: rows keep their order per plugin
        if json_path:  # after every row, so a long run that is interrupted keeps what it measured
            Path(json_path).write_text(json.dumps(results, indent=2))

    from .bench_refill import REFILL_ROWS, run_refill_bench

    if "ar" in selected:  # plain-AR rows that document a bundled model's own quality, as it declares them
        for model in bundled_models():
            for settings in bundled_model_info(model).bench_ar_rows:
                add(run_bench("ar", model=model, device=device, seed=seed, progress=progress, settings=settings))
    for name in selected:
        if name == "ar":
            continue
        plugin_cls = get_plugin_class(name)
        variants = plugin_cls.bench_default_variants or ALL_VARIANTS
        for variant in tuple(variants) + tuple(plugin_cls.bench_variants):
            add(run_bench(name, model=variant.get("model"), device=device, seed=seed, progress=progress,
                          num_samples=variant.get("num_samples"), batch_size=variant.get("batch_size", 1),
                          settings=variant.get("settings")))
        for row in REFILL_ROWS:
            if row["plugin"] == name:
                add(run_refill_bench(name, model=row.get("model"), device=device, seed=seed, progress=progress,
                                     settings=row.get("settings"), num_samples=row.get("num_samples")))
    if markdown:
        json_arg = f" --json {Path(json_path).name}" if json_path else ""
        write_markdown(results, markdown, f"mmspec bench --all{json_arg} --markdown {Path(markdown).name}")
    return results
