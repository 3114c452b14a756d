"""Text of bench rows: the cells BENCHMARKS.md tables and the pipelines' own sections share."""

from __future__ import annotations

from dataclasses import asdict

from .registry import get_plugin_class


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
