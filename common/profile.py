"""`mmspec bench --profile`: where a plugin's time goes, per decode step, next to plain AR's.

A decode step is one target forward. Its time splits into the phases the
decoders time (`DecodeStats.timer`: draft, verify, accept; CUDA is
synchronised at each boundary, so the split is real on a GPU too) and
"other": the loop's own work outside those timers (commit, rows leaving,
statistics). A plugin beats AR in the decode loop when the forwards it saves
outweigh what its step costs over an AR step:

    loop speed-up = (AR forwards / plugin forwards) × (AR step time / plugin step time)

so the profile names the phase that makes the plugin's step dearer, and the
forward ratio at which the plugin would break even.
"""

from __future__ import annotations

from .bench_format import config_text

PHASES = ("draft", "verify", "accept", "other")
PROFILE_INTRO = (
    "Per decode step (one target forward), from the same runs as the rows above (`mmspec bench --profile` "
    "prints the full split of one row). Verify width: tokens per row the plugin's target forward feeds, and "
    "what that forward costs relative to plain AR's one-token forward. Loop: the decode loop's speed-up as the "
    "target forwards it saves times the step cost ratio (AR step / plugin step); bound: the phase that adds "
    "most to the plugin's step over an AR step ('other' is the loop's own work outside the timed phases).")


def _side(summary: dict, num_samples: int) -> dict | None:
    split = summary.get("time_split_s", {})
    steps = summary.get("target_nfe", 0)
    if "total" not in split or not steps:
        return None  # a row written before the step timers, or a decoder that runs no timed target forward
    loop = split["total"] - split.get("prefill", 0.0)
    timed = {phase: split.get(phase, 0.0) for phase in PHASES[:3]}
    per_step = {phase: seconds / steps for phase, seconds in timed.items()}
    per_step["other"] = max(0.0, loop - sum(timed.values())) / steps
    return {"steps": steps, "per_step_s": per_step, "step_s": loop / steps, "loop_s": loop,
            "width": summary.get("target_width") or None, "drafter_nfe": summary.get("drafter_nfe", 0),
            "draft_s": timed["draft"],
            # the pipeline's work around the decode call (prompt prefill, encoders, image / audio decoding)
            "outside_s_per_sample": summary["latency_s_per_sample"] - split["total"] / max(1, num_samples)}


def step_profile(row: dict) -> dict | None:
    """The per-step split of a bench row's two sides and what follows from it; None when the row carries no
    step timers (rows written before they existed, decoders that do not time their steps)."""
    base = _side(row["baseline"], row["num_samples"])
    acc = _side(row["accelerated"], row["num_samples"])
    if base is None or acc is None:
        return None
    one_token = base["per_step_s"]["verify"]  # plain AR verifies exactly one token per row
    extra = {phase: acc["per_step_s"][phase] - base["per_step_s"][phase] for phase in PHASES}
    forwards_saved = base["steps"] / acc["steps"]
    step_cost = base["step_s"] / acc["step_s"] if acc["step_s"] > 0 else float("inf")
    drafter = None
    if acc["drafter_nfe"]:
        each = acc["draft_s"] / acc["drafter_nfe"]
        drafter = {"per_step": acc["drafter_nfe"] / acc["steps"], "forward_s": each,
                   "vs_target_forward": each / one_token if one_token > 0 else None}
    return {
        "baseline": base, "accelerated": acc,
        "verify_width": acc["width"],
        "verify_vs_one_token": acc["per_step_s"]["verify"] / one_token if one_token > 0 else None,
        "drafter": drafter,
        "forwards_saved": forwards_saved,
        "step_cost_ratio": step_cost,  # AR step / plugin step: below 1 when the plugin's step is dearer
        "loop_speedup": forwards_saved * step_cost,
        "extra_per_step_s": extra,
        "bound": max(extra, key=extra.get),  # the phase that adds most to the plugin's step
        "break_even_forwards": acc["step_s"] / base["step_s"] if base["step_s"] > 0 else None,
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def format_profile(row: dict) -> str:
    """A few lines: the per-step split of AR and the plugin, forward costs, and what bounds the speed-up."""
    head = f"where the time goes: {row['plugin']} on {row['model']}, batch {row['batch_size']}"
    prof = step_profile(row)
    if prof is None:
        return f"{head}: no per-step timers in this row (rerun it with this mmspec to get them)"
    lines = [f"{head} (ms per decode step; one step = one target forward)",
             f"  {'side':<12}{'steps':>7}" + "".join(f"{p:>8}" for p in PHASES) + f"{'step':>8}"]
    for side, name in (("baseline", "ar"), ("accelerated", row["plugin"])):
        s = prof[side]
        lines.append(f"  {name:<12}{s['steps']:>7}" + "".join(f"{_ms(s['per_step_s'][p]):>8}" for p in PHASES)
                     + f"{_ms(s['step_s']):>8}")
    base, acc = prof["baseline"], prof["accelerated"]
    if prof["verify_width"] and prof["verify_vs_one_token"] is not None:
        lines.append(f"  target forward: 1 token/row {_ms(base['per_step_s']['verify'])} ms; "
                     f"{prof['verify_width']:.1f} tokens/row {_ms(acc['per_step_s']['verify'])} ms "
                     f"(verifying {prof['verify_width']:.1f} tokens costs {prof['verify_vs_one_token']:.2f}x one)")
    if prof["drafter"] is not None:
        d = prof["drafter"]
        relative = f" ({d['vs_target_forward']:.2f}x a one-token target forward)" if d["vs_target_forward"] else ""
        lines.append(f"  drafter: {d['per_step']:.1f} forwards/step, {_ms(d['forward_s'])} ms each{relative}")
    lines.append(f"  decode loop: {prof['forwards_saved']:.2f}x fewer target forwards x {prof['step_cost_ratio']:.2f} "
                 f"step cost (AR/plugin) = {prof['loop_speedup']:.2f}x; measured wall-clock {row['speedup']:.2f}x "
                 f"(with the pipeline's own work: {_ms(base['outside_s_per_sample'])} -> "
                 f"{_ms(acc['outside_s_per_sample'])} ms/sample outside the decode call)")
    extra = prof["extra_per_step_s"]
    parts = ", ".join(f"{p} {extra[p] * 1e3:+.2f}" for p in PHASES)
    total = acc["step_s"] - base["step_s"]
    verdict = (f"breaks even at {prof['break_even_forwards']:.2f}x fewer forwards"
               if prof["break_even_forwards"] and prof["break_even_forwards"] > 1 else "costs no more than an AR step")
    lines.append(f"  bound: a plugin step costs {total * 1e3:+.2f} ms over an AR step ({parts}); most from "
                 f"{prof['bound']}; it {verdict}")
    return "\n".join(lines)


def format_profile_table(results: list[dict]) -> str:
    """BENCHMARKS.md's "Where the time goes": one line per row that carries step timers."""
    rows = ["| plugin | config | batch | ms/step AR → plugin | plugin draft / verify / accept / other ms | "
            "verify width (× one token) | drafter forward (× target) | forwards saved × step cost = loop | "
            "bound |", "|" + "---|" * 9]

    for r in results:
        prof = step_profile(r)
        if prof is None:
            continue
        base, acc = prof["baseline"], prof["accelerated"]
        split = " / ".join(_ms(acc["per_step_s"][p]) for p in PHASES)
        width = (f"{prof['verify_width']:.1f} ({prof['verify_vs_one_token']:.2f}×)"
                 if prof["verify_width"] and prof["verify_vs_one_token"] is not None else "—")
        d = prof["drafter"]
        drafter = f"{_ms(d['forward_s'])} ms ({d['vs_target_forward']:.2f}×)" if d and d["vs_target_forward"] else "—"
        rows.append(f"| {r['plugin']} | {config_text(r)} | {r['batch_size']} | {_ms(base['step_s'])} → "
                    f"{_ms(acc['step_s'])} | {split} | {width} | {drafter} | {prof['forwards_saved']:.2f} × "
                    f"{prof['step_cost_ratio']:.2f} = {prof['loop_speedup']:.2f}× | {prof['bound']} |")
    return "\n".join(rows) if len(rows) > 2 else ""
