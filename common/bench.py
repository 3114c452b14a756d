"""`mmspec bench` rows into BENCHMARKS.md, and `--all`: every plugin's rows in one run.

One bench row (plain AR and a plugin on the same model, inputs, seeds and device, in one process) is run by
`mmspec.common.bench_run`, whose docstring is the row's JSON contract; the text of its cells is in
`mmspec.common.bench_format`. Nothing here knows a modality: each pipeline adds its own BENCHMARKS.md
sections (`bench_sections`).
"""

from __future__ import annotations

import json
from pathlib import Path

from .bench_format import (compression_text, config_text, exact_text, format_compile_table,  # noqa: F401
                           quality_comparison, quality_text, sampling_text)
from .bench_refill import REFILL_INTRO, REFILL_ROWS, format_refill_table, run_refill_bench
from .bench_run import (bench_environment, cut_after, interleaved_runs, run_bench, run_compile_bench,  # noqa: F401
                        run_peer, split_settings)
from .config import parse_settings  # noqa: F401  (re-exported for the CLI and tests)
from .gpu_report import format_gpu_section
from .profile import PROFILE_INTRO, format_profile_table
from .registry import (bundled_model_info, bundled_models, get_pipeline_class, get_plugin_class, list_pipelines,
                       list_plugins)


def pipeline_sections(results: list[dict]) -> list[tuple[str, str, str]]:
    """Each registered pipeline's own BENCHMARKS.md sections, over the rows measured on it."""
    sections = []
    for name in list_pipelines():
        rows = [r for r in results if r.get("pipeline") == name]
        if rows:
            sections += get_pipeline_class(name).bench_sections(rows)
    return sections


def format_compact_table(results: list[dict]) -> str:
    """The figures a reader compares first: speed-up, what it costs in forwards, and quality (`--wide`: all)."""
    rows = ["| plugin | config | model | batch | sampling | speedup | step compr. | mean accepted | exact match | "
            "quality (AR → plugin) |", "|" + "---|" * 10]
    for r in results:
        acc = r["accelerated"]
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
    profile = format_profile_table(results)
    if profile:
        text += ["## Where the time goes", "", PROFILE_INTRO, "", profile, ""]
    gpu_path = Path(gpu_report) if gpu_report is not None else Path(path).with_name("benchmarks_gpu.json")
    if gpu_path.exists():
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
