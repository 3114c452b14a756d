"""The documents section of BENCHMARKS.md: parsing quality beside pages per second, per mode."""

from __future__ import annotations

from mmspec.common.bench_format import config_text, exact_text


def _quality(q: dict) -> str:
    parts = []
    if "text_ned" in q:
        parts.append(f"text NED {q['text_ned']:.3f}")
    if "table_teds" in q:
        parts.append(f"TEDS {q['table_teds']:.3f}")
    if "formula_exact" in q:
        parts.append(f"formula exact {q['formula_exact']:.0%}")
    if "layout_f1" in q:
        parts.append(f"layout F1 {q['layout_f1']:.3f}")
    return ", ".join(parts) or "—"


def _mode(settings: dict) -> str:
    mode = settings.get("mode", "page")
    if mode == "layout+regions":  # rows measured before streaming existed ran the two passes
        return mode + (", two passes" if settings.get("stream", False) is False else ", streamed")
    return mode


def docs_table(results: list[dict]) -> str:
    """Rows measured on pages: mode, quality of both sides, pages / s, tokens / s and target forwards per page."""
    rows = [r for r in results if r.get("pipeline") == "docs"]
    if not rows:
        return ""
    lines = ["| plugin | config | model | mode | batch | pages | quality AR | quality plugin | pages / s AR → plugin "
             "| tokens / s AR → plugin | target forwards / page AR → plugin | regions / page | speed-up | exact match |",
             "|" + "---|" * 14]
    for r in rows:
        base, acc = r["baseline"], r["accelerated"]
        lines.append(
            f"| {r['plugin']} | {config_text(r)} | {r['model']} | {_mode(r.get('settings', {}))} | "
            f"{r['batch_size']} | {r['num_samples']} | {_quality(base['quality'])} | {_quality(acc['quality'])} | "
            f"{base['pages_per_second']:.2f} → {acc['pages_per_second']:.2f} | "
            f"{base['tokens_per_second']:.0f} → {acc['tokens_per_second']:.0f} | "
            f"{base['target_nfe'] / r['num_samples']:.1f} → {acc['target_nfe'] / r['num_samples']:.1f} | "
            f"{acc['regions_per_page']:.1f} | "
            f"{r['speedup']:.2f}× | {exact_text(r)} |")
    return "\n".join(lines)
