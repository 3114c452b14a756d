"""The "On a GPU" section of BENCHMARKS.md, rendered from what `examples/gpu_bench.py` wrote
(`benchmarks_gpu.json`): plugins at batch 1 and 8, native kernels against their torch references, host
synchronisations as CUDA counts them, compiled vs eager."""

from __future__ import annotations

from .bench_format import format_compile_table


def _plugin_line(r: dict) -> str:
    head = f"| {r['plugin']} | {r['batch_size']} | {r['num_samples']} |"
    if "error" in r:
        return f"{head} failed: {r['error'][:160]} | | | | | |"
    if "skipped" in r:
        return f"{head} skipped: {r['skipped']} | | | | | |"
    exact = "—" if r["exact_match_rate"] is None else f"{r['exact_match_rate']:.2f}"
    steps = "—" if r["ms_per_step"] is None else f"{r['ms_per_step'][0]:.2f} → {r['ms_per_step'][1]:.2f}"
    compression = "—" if r["step_compression"] is None else f"{r['step_compression']:.2f}×"
    return (f"{head} {r['speedup']:.2f}× | {compression} | {r['mean_accepted']:.2f} | {exact} | {steps} | "
            f"{r['bound'] or '—'} |")


def _kernel_line(k: dict) -> str:
    torch_us = f"{k['torch_s'] * 1e6:.1f}" if "torch_s" in k else "—"
    if "error" in k or "skipped" in k:
        return f"| {k['kernel']} | {torch_us} | {k.get('error') or k['skipped']} | |"
    return f"| {k['kernel']} | {torch_us} | {k['triton_s'] * 1e6:.1f} | {'yes' if k['agree'] else 'NO'} |"


def format_gpu_section(report: dict) -> str:
    env = report["environment"]
    where = env["gpu"] or "a CPU (a smoke run: its sizes and times mean nothing)"
    lines = [f"Written by `{report['command']}` on {where}, torch {env['torch']}, {report['dtype']}; "
             f"{report['seconds']:.0f} s in all. Few samples per row (the run must fit 8 minutes): read speed-ups, "
             "not quality.", "",
             "| plugin | batch | samples | speed-up | step compr. | mean accepted | exact match | "
             "ms/step AR → plugin | bound |", "|" + "---|" * 9]
    lines += [_plugin_line(r) for r in report["plugins"]]
    lines += ["", "| kernel | torch µs | Triton µs | agree |", "|---|---|---|---|"]
    lines += [_kernel_line(k) for k in report["kernels"]]
    syncs = report["syncs"]
    if "skipped" in syncs:
        lines += ["", f"Host synchronisations: {syncs['skipped']}."]
    else:
        lines += ["", "Host synchronisations per decode step, as CUDA counts them: " + "; ".join(
            f"eagle {name} {s['per_step']:.2f} ({s['syncs']} in {s['steps']} steps)" for name, s in syncs.items())
            + "."]

    lines += ["", "Compiled vs eager step forwards (`mmspec bench PLUGIN --compile`; greedy, batch 1):", ""]
    done = [r for r in report["compile"] if "seconds" in r]
    if done:
        lines.append(format_compile_table(done))
    lines += [f"- {r['plugin']}: {r.get('error') or r['skipped']}" for r in report["compile"] if "seconds" not in r]
    plan = report.get("tree_plan")
    if plan:
        lines += ["", "The draft tree planned for this machine (`mmspec plan-tree`, batch 1): "]
        if "best" not in plan:
            lines[-1] += plan.get("error") or plan["skipped"]
        else:
            best, chain = plan["best"], plan["best_chain"]
            line = (f"{plan['plugin']}'s best is {best['label']} ({best['expected_tokens']:.2f} tokens per "
                    f"{best['ms_per_step']:.1f} ms step, `tree_branching={best['settings']['tree_branching']!r}`)")
            if chain:
                rate = lambda c: c["expected_tokens"] / c["ms_per_step"]  # noqa: E731
                ratio = rate(best) / rate(chain)
                line += (f"; the best chain, {chain['label']}: {chain['expected_tokens']:.2f} tokens per "
                         f"{chain['ms_per_step']:.1f} ms ({ratio:.2f}× in tokens/s for the plan)")
            lines[-1] += line + "."
    return "\n".join(lines)
