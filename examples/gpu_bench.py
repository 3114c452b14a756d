"""The prepared GPU benchmark: one run on a machine with one CUDA GPU, under 8 minutes, nothing installed
beyond the project.

    bash examples/gpu_bench.sh              # on the GPU machine (same as: python examples/gpu_bench.py)
    python examples/gpu_bench.py --smoke    # on a CPU: every part, tiny sizes (the kernels under the Triton
                                            # interpreter when TRITON_INTERPRET=1), to check the script runs

It records, in `benchmarks_gpu.json` and the "On a GPU" section of BENCHMARKS.md (re-rendered from
benchmarks.json plus this file):
1. every plugin at batch 1 and 8 in bf16 on its bundled model: AR vs plugin wall-clock, target forwards,
   exact match (greedy rows), with the per-step profile (`mmspec bench --profile`) of each row;
2. each native Triton kernel against its torch reference on the same inputs: time and agreement;
3. host synchronisations per decode step, counted by CUDA itself (`torch.cuda.set_sync_debug_mode`);
4. compiled vs eager step forwards (`mmspec bench PLUGIN --compile`): AR and `sjd` / `eagle` on the bundled
   LlamaGen, greedy, eager and compiled (CUDA graphs: mode "reduce-overhead"), with output identity;
5. the draft tree planned for the GPU (`mmspec plan-tree eagle`): on a CPU the plan is a short chain, since
   every verified node costs; on a GPU wide trees should pay, and this part says which tree does.
Rows run until a time budget is spent; what did not fit is listed as skipped, never dropped silently.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


# --- 2. kernels ------------------------------------------------------------------------------------------
def kernel_cases(device, small: bool):
    """(name, inputs builder, call) for each kernel with a Triton implementation and a torch reference."""
    from mmspec.common.kernels import greedy_accept, sample_inverse_cdf, speculative_accept
    from mmspec.plugins.ctc_draft.kernels import ctc_greedy, floor_accept
    from mmspec.plugins.jacobi.kernels import maximal_coupling
    from mmspec.plugins.lantern.kernels import pooled_probability

    batch, k, vocab = (2, 3, 64) if small else (8, 4, 16384)
    frames = 20 if small else 400
    g = torch.Generator(device="cpu").manual_seed(0)

    def probs(*shape):
        return torch.softmax(torch.randn(*shape, generator=g) * 3, -1).to(device)

    def tokens(*shape, high=vocab):
        return torch.randint(0, high, shape, generator=g).to(device)

    def uniform(*shape):
        return torch.rand(*shape, generator=g).to(device)

    neighbours = tokens(vocab, 8)
    return [
        ("greedy_accept", lambda: (tokens(batch, k), tokens(batch, k + 1)), greedy_accept),
        ("speculative_accept", lambda: (tokens(batch, k), probs(batch, k, vocab), probs(batch, k + 1, vocab),
                                        uniform(batch, k), uniform(batch)), speculative_accept),
        ("sample_inverse_cdf", lambda: (probs(batch * (k + 1), vocab), uniform(batch * (k + 1))), sample_inverse_cdf),
        ("pooled_probability (LANTERN, delta)", lambda: (tokens(batch * k), neighbours, probs(batch * k, vocab)),
         lambda t, n, p: pooled_probability(t, n, p, delta=0.1)),
        ("pooled_probability (LANTERN++, lam)", lambda: (tokens(batch * k), neighbours, probs(batch * k, vocab)),
         lambda t, n, p: pooled_probability(t, n, p, lam=5.0)),
        ("ctc_greedy", lambda: (torch.randn(batch, frames, 64, generator=g).to(device),
                                torch.full((batch,), frames).to(device)), ctc_greedy),
        ("floor_accept", lambda: (tokens(batch, k), probs(batch, k + 1, vocab)), lambda t, p: floor_accept(t, p, 0.05)),
        ("maximal_coupling", lambda: (tokens(batch * k), probs(batch * k, vocab), probs(batch * k, vocab),
                                      uniform(batch * k), uniform(batch * k)), maximal_coupling),
    ]


def _timed(fn, args, device, repeats: int) -> float:
    """Median seconds per call (CUDA events on a GPU)."""
    fn(*args)  # compile / warm up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - begin)
    return statistics.median(times)


def _agree(a, b) -> bool:
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    for x, y in zip(a, b):
        if x.dtype.is_floating_point:
            if not torch.allclose(x.float(), y.float(), rtol=1e-4, atol=1e-5):
                return False
        elif not torch.equal(x, y):
            return False
    return True


def bench_kernels(device, small: bool) -> list[dict]:
    from mmspec.common.kernels import HAS_TRITON

    rows = []
    repeats = 3 if small else 50
    chosen = os.environ.get("MMSPEC_KERNELS")  # restored after: the plugin rows run with the caller's choice
    for name, make, call in kernel_cases(device, small):
        args = make()
        row = {"kernel": name}
        try:
            os.environ["MMSPEC_KERNELS"] = "torch"
            reference = call(*args)
            row["torch_s"] = _timed(call, args, device, repeats)
            if HAS_TRITON and (device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"):
                os.environ["MMSPEC_KERNELS"] = "triton"
                native = call(*args)
                row["triton_s"] = _timed(call, args, device, repeats)
                row["agree"] = _agree(reference, native)
            else:
                row["skipped"] = "no Triton backend here (a GPU, or TRITON_INTERPRET=1 on a CPU)"
        except Exception as error:  # a kernel that fails is a finding to record, not a reason to stop
            row["error"] = f"{type(error).__name__}: {error}"
        finally:
            if chosen is None:
                os.environ.pop("MMSPEC_KERNELS", None)
            else:
                os.environ["MMSPEC_KERNELS"] = chosen
        rows.append(row)
    return rows


# --- 1. plugins -------------------------------------------------------------------------------------------
def bench_plugins(device: str, dtype: str, small: bool, deadline: float, only: list[str] | None) -> list[dict]:
    from mmspec.common.bench import run_bench
    from mmspec.common.profile import step_profile
    from mmspec.common.registry import list_plugins

    plugins = [p for p in list_plugins() if p != "ar" and (only is None or p in only)]
    rows = []
    for batch in (1, 8):
        for plugin in plugins:
            num = (1 if batch == 1 else 2) if small else (4 if batch == 1 else 16)
            head = {"plugin": plugin, "batch_size": batch, "num_samples": num, "dtype": dtype}
            if time.monotonic() > deadline:
                rows.append({**head, "skipped": "time budget spent"})
                continue
            try:
                begin = time.monotonic()
                r = run_bench(plugin, num_samples=num, batch_size=batch, device=device, dtype=dtype,
                              progress=lambda _: None)
                prof = step_profile(r)
                rows.append({**head, "model": r["model"], "speedup": r["speedup"],
                             "step_compression": r["step_compression"], "exact_match_rate": r["exact_match_rate"],
                             "mean_accepted": r["accelerated"]["mean_accepted"],
                             "ms_per_step": None if prof is None else [prof["baseline"]["step_s"] * 1e3,
                                                                       prof["accelerated"]["step_s"] * 1e3],
                             "bound": None if prof is None else prof["bound"],
                             "seconds": time.monotonic() - begin})
            except Exception as error:
                rows.append({**head, "error": f"{type(error).__name__}: {error}",
                             "trace": traceback.format_exc(limit=3)})
    return rows


# --- 4. compiled vs eager ------------------------------------------------------------------------------------
def bench_compile(device: str, small: bool, deadline: float) -> list[dict]:
    """`run_compile_bench` rows: greedy, batch 1; on a CPU smoke run one tiny row through aot_eager (no C++
    compiler needed), on a GPU inductor with CUDA graphs."""
    from mmspec.common.bench import run_compile_bench

    compile = {"backend": "aot_eager"} if small else {"backend": "inductor", "mode": "reduce-overhead"}
    rows = []
    for plugin in (("sjd",) if small else ("sjd", "eagle")):
        head = {"plugin": plugin, "batch_size": 1}
        if time.monotonic() > deadline:
            rows.append({**head, "skipped": "time budget spent"})
            continue
        try:
            rows.append(run_compile_bench(plugin, num_samples=1 if small else 4, batch_size=1, device=device,
                                          settings={"temperature": 0.0}, compile=compile, progress=lambda _: None))
        except Exception as error:
            rows.append({**head, "error": f"{type(error).__name__}: {error}"})
    return rows


# --- 5. the tree planned for this machine ----------------------------------------------------------------------
def plan_for_gpu(device: str, small: bool, deadline: float) -> dict:
    """`plan_tree` for eagle at batch 1 (the smoke run: speculative's text pair at toy sizes)."""
    if time.monotonic() > deadline:
        return {"skipped": "time budget spent"}
    from dataclasses import asdict

    from mmspec.common.tree_plan import plan_tree

    plugin = "speculative" if small else "eagle"
    try:
        plan = plan_tree(plugin, num_samples=1 if small else 8, timing_samples=1 if small else 2, batch_size=1,
                         max_nodes=2 if small else 32, device=device, progress=lambda _: None)
    except Exception as error:
        return {"plugin": plugin, "error": f"{type(error).__name__}: {error}"}
    return {"plugin": plugin, "best": asdict(plan.best),
            "best_chain": asdict(plan.best_chain()) if plan.best_chain() else None,
            "candidates": [asdict(c) for c in plan.candidates], "rates": plan.calibration["rates"]}


# --- 3. host syncs ------------------------------------------------------------------------------------------
def count_cuda_syncs(device: str, small: bool) -> dict:
    """Real synchronisations per decode step of `eagle` (chain and tree), as CUDA reports them."""
    if device != "cuda":
        return {"skipped": "CUDA counts its own synchronisations only on a GPU (the CPU test counts host reads)"}
    from mmspec import load_plugin
    from mmspec.common.loading import default_pipeline
    from mmspec.common.registry import get_plugin_class

    out = {}
    base = default_pipeline(get_plugin_class("eagle"), device="cuda")
    for tree in ("", "4,2,1,1"):
        pipe = load_plugin("eagle", pipeline=base, tree_branching=tree)
        pipe.set_progress_bar_config(disable=True)
        call = dict(class_labels=[3, 5], guidance_scale=3.0, temperature=1.0, output_type="pt")
        pipe(**call, generator=torch.Generator("cuda").manual_seed(0))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                result = pipe(**call, generator=torch.Generator("cuda").manual_seed(0))
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchroniz" in str(w.message) for w in caught)
        steps = result.stats.target_nfe
        out["tree " + tree if tree else "chain"] = {"syncs": syncs, "steps": steps, "per_step": syncs / steps}
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on whatever device is here (CPU check)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting plugin rows after this")
    parser.add_argument("--only", default=None, help="comma-separated plugins (default: all)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks_gpu.json"))
    parser.add_argument("--markdown", default=str(ROOT / "BENCHMARKS.md"),
                        help="re-rendered from benchmarks.json with this run's section ('' = do not write)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        raise SystemExit("gpu_bench: no CUDA GPU here; use --smoke to check the script on a CPU")
    device = "cuda" if cuda else "cpu"
    dtype = "bfloat16" if cuda else "float32"  # bf16 matmuls on a CPU would time the CPU's bf16 path, not ours
    only = [p.strip() for p in args.only.split(",")] if args.only else None
    report = {"command": "bash examples/gpu_bench.sh" if not args.smoke else "python examples/gpu_bench.py --smoke",
              "dtype": dtype,
              "environment": {"torch": torch.__version__, "python": platform.python_version(),
                              "gpu": torch.cuda.get_device_name() if cuda else None}}
    report["kernels"] = bench_kernels(torch.device(device), small=args.smoke)
    report["syncs"] = count_cuda_syncs(device, small=args.smoke)
    report["plugins"] = bench_plugins(device, dtype, args.smoke, start + args.budget_s, only)
    report["compile"] = bench_compile(device, args.smoke, start + args.budget_s + 40)
    report["tree_plan"] = plan_for_gpu(device, args.smoke, start + args.budget_s + 80)
    report["seconds"] = time.monotonic() - start
    Path(args.out).write_text(json.dumps(report, indent=2))
    from mmspec.common.gpu_report import format_gpu_section

    print(format_gpu_section(report))
    results_path = Path(args.markdown).with_name("benchmarks.json") if args.markdown else None
    if results_path is not None and results_path.exists():
        from mmspec.common.bench import write_markdown

        write_markdown(json.loads(results_path.read_text()), args.markdown,
                       "mmspec bench --all --json benchmarks.json --markdown BENCHMARKS.md", gpu_report=Path(args.out))


if __name__ == "__main__":
    main()
