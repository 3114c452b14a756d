"""The speech section of BENCHMARKS.md: word error next to real-time factors, and the CTC-only ceiling."""

from __future__ import annotations

from mmspec.common.bench_format import config_text, exact_text


def _error_text(base: dict, acc: dict, metric: str) -> str:
    if metric not in base:
        return "—"
    if metric == "words_per_clip":  # noise: words made up per clip
        return f"{base[metric]:.1f} → {acc[metric]:.1f} words/clip"
    b, a = base[metric], acc[metric]
    relative = f" ({(a - b) / b:+.0%})" if metric == "wer" and b > 0 else ""
    return f"{b:.1%} → {a:.1%}{relative}"


def speech_table(results: list[dict]) -> str:
    """Rows measured on audio: WER next to inverse real-time factors, and the ceiling a method could reach
    (AR time / CTC-only time: the `ctc_draft` row with mode=ctc at the same batch size, model and test set)."""
    speech = [r for r in results if "inverse_rtf" in r["accelerated"]
              and ({"wer", "words_per_clip"} & set(r["baseline"]["quality"]))]
    if not speech:
        return ""

    def test_set(r):
        return r["settings"].get("test_set", "in_domain")

    ceilings = {(r["model"], r["batch_size"], test_set(r)): r["speedup"] for r in speech
                if r["config"].get("mode") == "ctc"}
    lines = ["| plugin | config | model | test set | batch | WER AR → plugin (relative) | CER AR → plugin "
             "| inverse RTF AR → plugin | speed-up | ceiling | gated | exact match |", "|" + "---|" * 12]
    for r in speech:
        base, acc = r["baseline"], r["accelerated"]
        ceiling = ceilings.get((r["model"], r["batch_size"], test_set(r)))
        wer = _error_text(base["quality"], acc["quality"], "wer" if "wer" in base["quality"] else "words_per_clip")
        lines.append(f"| {r['plugin']} | {config_text(r)} | {r['model']} | {test_set(r)} | {r['batch_size']} | "
                     f"{wer} | {_error_text(base['quality'], acc['quality'], 'cer')} | "
                     f"{base['inverse_rtf']:.0f} → {acc['inverse_rtf']:.0f} | {r['speedup']:.2f}× | "
                     f"{'—' if ceiling is None else f'{ceiling:.2f}×'} | {acc['gated_fraction']:.0%} | "
                     f"{exact_text(r)} |")
    return "\n".join(lines)


def tts_table(results: list[dict]) -> str:
    """Rows measured on synthesized speech: judge WER / CER and MCD next to RTF and the depth decoder's share
    of the time (the part RVQ speculation shortens)."""
    rows = [r for r in results if r.get("pipeline") == "tts"]
    if not rows:
        return ""
    lines = ["| plugin | config | model | batch | samples | Whisper WER AR → plugin | asr-tiny WER | MCD dB "
             "| RTF AR → plugin | speed-up | depth calls / frame | depth share | exact match |",
             "|" + "---|" * 13]
    for r in rows:
        base, acc = r["baseline"], r["accelerated"]
        bq, aq = base["quality"], acc["quality"]
        lines.append(
            f"| {r['plugin']} | {config_text(r)} | {r['model']} | {r['batch_size']} | {r['num_samples']} | "
            f"{bq['whisper_wer']:.1%} → {aq['whisper_wer']:.1%} | {bq['asr_tiny_wer']:.1%} → "
            f"{aq['asr_tiny_wer']:.1%} | {bq['mcd_db']:.2f} → {aq['mcd_db']:.2f} | {base['rtf']:.2f} → "
            f"{acc['rtf']:.2f} | {r['speedup']:.2f}× | {base['depth_calls_per_frame']:.2f} → "
            f"{acc['depth_calls_per_frame']:.2f} | {base['time_share']['depth']:.0%} → "
            f"{acc['time_share']['depth']:.0%} | {exact_text(r)} |")
    return "\n".join(lines)


def rvq_table(results: list[dict]) -> str:
    """`rvq_spec` rows: codes per depth call, calls per frame, the RVQ-generation and end-to-end speed-ups,
    RTF, judge WER and the AR-vs-plugin code-histogram distance beside its permutation noise."""
    from mmspec.common.bench_format import sampling_text

    rows = [r for r in results if r.get("pipeline") == "tts" and r["plugin"] != "ar"]
    if not rows:
        return ""
    lines = ["| plugin | config | batch | samples | sampling | codes / call | depth calls / frame AR → plugin "
             "| RVQ speed-up (calls) | RVQ speed-up (wall) | end to end | RTF AR → plugin | Whisper WER AR → plugin "
             "| code TV (noise) | exact match |", "|" + "---|" * 14]
    for r in rows:
        base, acc = r["baseline"], r["accelerated"]
        depth_time = (base["time_split_by_stage_s"]["depth"] / max(acc["time_split_by_stage_s"]["depth"], 1e-9)
                      if "time_split_by_stage_s" in base else float("nan"))
        comparison = r.get("comparison") or {}
        tv = comparison.get("code_tv_per_level", [float("nan")] * 2)[1:]
        noise = comparison.get("code_tv_null_mean_per_level", [float("nan")] * 2)[1:]
        worst = max(range(len(tv)), key=lambda i: tv[i] - noise[i])
        lines.append(
            f"| {r['plugin']} | {config_text(r)} | {r['batch_size']} | {r['num_samples']} | "
            f"{sampling_text(r.get('settings', {}))} | {acc['mean_accepted']:.2f} | "
            f"{base['depth_calls_per_frame']:.2f} → {acc['depth_calls_per_frame']:.2f} | "
            f"{base['depth_calls_per_frame'] / max(acc['depth_calls_per_frame'], 1e-9):.2f}× | {depth_time:.2f}× | "
            f"{r['speedup']:.2f}× | {base['rtf']:.2f} → {acc['rtf']:.2f} | "
            f"{base['quality']['whisper_wer']:.1%} → {acc['quality']['whisper_wer']:.1%} | "
            f"{tv[worst]:.3f} ({noise[worst]:.3f}) | {exact_text(r)} |")
    return "\n".join(lines)
