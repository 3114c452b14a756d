"""The speech section of BENCHMARKS.md: word error next to real-time factors, and the CTC-only ceiling."""

from __future__ import annotations

from mmspec.common.bench import config_text, exact_text


def speech_table(results: list[dict]) -> str:
    """Rows measured on audio: WER next to inverse real-time factors, and the ceiling a method could reach
    (AR time / CTC-only time: the `ctc_draft` row with mode=ctc at the same batch size and model)."""
    speech = [r for r in results if "inverse_rtf" in r["accelerated"] and "wer" in r["baseline"]["quality"]]
    if not speech:
        return ""
    ceilings = {(r["model"], r["batch_size"]): r["speedup"] for r in speech if r["config"].get("mode") == "ctc"}
    lines = ["| plugin | config | model | batch | WER AR → plugin (relative) | CER AR → plugin "
             "| inverse RTF AR → plugin | speed-up | ceiling | gated | exact match |", "|" + "---|" * 11]
    for r in speech:
        base, acc = r["baseline"], r["accelerated"]
        wer_b, wer_a = base["quality"]["wer"], acc["quality"]["wer"]
        relative = f"{(wer_a - wer_b) / wer_b:+.0%}" if wer_b > 0 else "—"
        ceiling = ceilings.get((r["model"], r["batch_size"]))
        lines.append(f"| {r['plugin']} | {config_text(r)} | {r['model']} | {r['batch_size']} | "
                     f"{wer_b:.1%} → {wer_a:.1%} "
                     f"({relative}) | {base['quality']['cer']:.1%} → {acc['quality']['cer']:.1%} | "
                     f"{base['inverse_rtf']:.0f} → {acc['inverse_rtf']:.0f} | {r['speedup']:.2f}× | "
                     f"{'—' if ceiling is None else f'{ceiling:.2f}×'} | {acc['gated_fraction']:.0%} | "
                     f"{exact_text(r)} |")
    return "\n".join(lines)
