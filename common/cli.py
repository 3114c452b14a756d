"""The `mmspec` command: list, bench, generate, batch, train-head, plan-tree."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import make_config, parse_settings
from .config import split_settings as split_call_and_config
from .manifest import read_manifest
from .loading import default_pipeline, resolve_model
from .registry import get_plugin_class, pipeline_class_name, pipeline_spec, plugin_summaries

# Nothing at module level imports torch, transformers or diffusers: `mmspec list`, `--help`, `--version` and
# mistakes in the arguments answer at once; each command imports what it runs.


def plugin_table(summaries) -> str:
    """The markdown table of `summaries` (`mmspec list --markdown`; the README's plugin table is this output,
    checked by tests/common/test_readme.py): modality-free plugins first, then by modality and name."""
    rows = sorted(summaries, key=lambda s: (s.modality != "any", s.modality, s.name))
    lines = ["| name | modality | lossless | method |", "|---|---|---|---|"]
    for s in rows:
        lossless = s.lossless_text or ("yes" if s.lossless else "no")
        lines.append(f"| `{s.name}` | {s.modality} | {lossless} | {s.method or s.paper} |")
    return "\n".join(lines)


def cmd_list(args) -> int:
    if args.markdown:
        print(plugin_table(plugin_summaries(args.modality)))
        return 0
    rows = [(s.name, s.modality, "yes" if s.lossless else "no", s.paper) for s in plugin_summaries(args.modality)]
    widths = [max(len(str(r[i])) for r in rows + [("name", "modality", "lossless", "paper")]) for i in range(3)]
    print(f"{'name':<{widths[0]}}  {'modality':<{widths[1]}}  {'lossless':<{widths[2]}}  paper")
    for name, modality, lossless, paper in rows:
        print(f"{name:<{widths[0]}}  {modality:<{widths[1]}}  {lossless:<{widths[2]}}  {paper}")
    return 0


def check_plugin_name(name: str):
    """The plugin's summary; an unknown name fails here, before torch loads (plugins are imported on first use)."""
    summaries = {s.name: s for s in plugin_summaries()}
    if name not in summaries:
        raise ValueError(f"unknown plugin {name!r}; available: {', '.join(summaries)}")
    return summaries[name]


@dataclass
class Preflight:
    """What a command knows before torch or any model loads: the plugin, the model and its pipeline's spec (None
    for a pipeline registered without one: its checks then wait for it to load), and the plugin's `--set`
    config (the call settings are checked too, and split again against the loaded pipeline's defaults)."""

    plugin: object  # PluginSummary
    model: str  # a bundled model's name or a saved folder
    pipeline: str | None  # its registered pipeline's class name (None: not declared by the bundled model)
    spec: object | None  # PipelineSpec
    config: dict  # the plugin's `--set` config


def preflight(plugin: str, model: str | None, set_pairs: list[str], bench: bool = False) -> Preflight:
    """Everything the registry, the config metadata, the pipeline's spec and the file system can tell about a
    command's plugin, model and `--set` values, without importing torch: one line on the first mistake."""
    summary = check_plugin_name(plugin)
    model, pipeline, _ = resolve_model(model if model is not None else summary.default_model, summary.modality)
    spec = pipeline_spec(pipeline) if pipeline is not None else None
    settings = parse_settings(set_pairs)
    shown = pipeline_class_name(pipeline) if pipeline is not None else None
    if spec is None:
        return Preflight(summary, model, shown, None, {})
    defaults = {**spec.call_defaults, **(spec.bench_defaults if bench else {})}
    config_cls = summary.config_class()
    call, config = split_call_and_config(defaults, config_cls, plugin, settings)
    spec.check_settings(call, bench=bench)
    make_config(config_cls, config)
    return Preflight(summary, model, shown, spec, config)


def quiet_weight_loading() -> None:
    """Called once a command's arguments are checked, as its heavy work begins."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars would bury the tables
    diffusers_logging.disable_progress_bar()


def check_device(device: str | None) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is visible here (torch.cuda.is_available() is False); "
                             "use --device cpu")


# Every seed the commands derive from --seed (seed + i, seed * 100003 + i) stays inside torch's 64-bit range.
MAX_SEED = 2 ** 32 - 1


def check_seed(seed: int) -> None:
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"--seed must be an int in [0, 2**32 - 1], got {seed}")


def check_counts(*flags: tuple[str, int]) -> None:
    """Each (flag, value) is a count: an int >= 1."""
    for flag, value in flags:
        if value < 1:
            raise ValueError(f"{flag} must be an int >= 1, got {value}")


def check_generate_args(args) -> None:
    """What `mmspec generate` can check before any model loads."""
    check_counts(("--num", args.num), ("--batch-size", args.batch_size))
    check_device(args.device)
    if args.out is not None:
        parent = Path(args.out).resolve().parent
        if not parent.is_dir():
            raise ValueError(f"--out {args.out!r}: the folder {str(parent)!r} does not exist")


def cmd_bench(args) -> int:
    log = (lambda *_: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    if args.plugin:
        preflight(args.plugin, args.model, args.set, bench=True)
    check_device(args.device)
    quiet_weight_loading()
    from .bench import (format_compact_table, format_peers, format_table, plugin_rows, run_all,
                        run_bench, write_markdown)

    if args.all:
        if args.plugin:
            raise SystemExit("mmspec bench: give a PLUGIN or --all, not both")
        only = [name.strip() for name in args.only.split(",") if name.strip()] if args.only else None
        results = run_all(args.markdown, args.json, device=args.device, seed=args.seed, progress=log, only=only)
    else:
        if not args.plugin:
            raise SystemExit(f"mmspec bench: name a PLUGIN (one of {', '.join(s.name for s in plugin_summaries())}) "
                             "or use --all")
        if args.compile is not None:
            from .bench import format_compile_table, run_compile_bench

            row = run_compile_bench(args.plugin, model=args.model, num_samples=args.num_samples,
                                    batch_size=args.batch_size, seed=args.seed, device=args.device,
                                    settings=parse_settings(args.set), compile=args.compile, progress=log)
            if args.json:
                Path(args.json).write_text(json.dumps(row, indent=2))
            print(format_compile_table([row]))
            return 0
        if args.refill:
            from .bench_refill import format_refill_table, run_refill_bench

            row = run_refill_bench(args.plugin, model=args.model, num_samples=args.num_samples,
                                   batch_size=args.batch_size, seed=args.seed, device=args.device,
                                   settings=parse_settings(args.set), progress=log)
            if args.json:
                Path(args.json).write_text(json.dumps(row, indent=2))
            print(format_refill_table([row]))
            return 0
        results = [run_bench(args.plugin, model=args.model, num_samples=args.num_samples,
                             batch_size=args.batch_size, seed=args.seed, device=args.device,
                             settings=parse_settings(args.set), progress=log)]
        if args.json:
            Path(args.json).write_text(json.dumps(results[0], indent=2))
        if args.markdown:
            write_markdown(results, args.markdown, "mmspec bench " + " ".join(sys.argv[2:]))
    print((format_table if args.wide else format_compact_table)(plugin_rows(results)))
    peers = format_peers(plugin_rows(results))
    if peers:
        print()
        print(peers)
    if args.profile:
        from .profile import format_profile

        for row in plugin_rows(results):
            print()
            print(format_profile(row))
    return 0


def pipeline_flags_parser(plugin: str, pipeline_cls_name: str, add_arguments) -> argparse.ArgumentParser:
    """The parser of a pipeline's own input flags (--prompt, --audio, ...), for what the generic parser left."""
    parser = argparse.ArgumentParser(prog=f"mmspec generate {plugin}", add_help=False,
                                     description=f"input flags of {pipeline_cls_name}")
    add_arguments(parser)
    return parser


def parse_pipeline_flags(args, parser: argparse.ArgumentParser, pipeline_cls_name: str) -> None:
    """Put the pipeline's input flags on `args`; a flag it does not take is one line listing those it does."""
    extra, unknown = parser.parse_known_args(args.pipeline_args)
    if unknown:
        flags = sorted(a.option_strings[0] for a in parser._actions) or ["(none)"]
        raise ValueError(f"unrecognized arguments {unknown} for a {pipeline_cls_name}; its input flags: "
                         f"{', '.join(flags)}")
    for key, value in vars(extra).items():
        setattr(args, key, value)


def cmd_generate(args) -> int:
    if args.plugin is None:
        if args.help:
            args.generate_parser.print_help()
            return 0
        raise ValueError(f"name a PLUGIN (one of {', '.join(s.name for s in plugin_summaries())})")
    check_generate_args(args)
    plan = preflight(args.plugin, args.model, args.set)
    spec = plan.spec
    if spec is not None:  # the pipeline's flags, inputs and --out, all before torch loads
        parser = pipeline_flags_parser(args.plugin, plan.pipeline, spec.add_arguments)
        if args.help:
            return print_generate_help(args, parser)
        parse_pipeline_flags(args, parser, plan.pipeline)
        spec.check_inputs(args)
        spec.check_num(args)
        spec.check_out(args.out, plan.pipeline)
    quiet_weight_loading()
    plugin_cls = get_plugin_class(args.plugin)
    plugin = plugin_cls(**plan.config)  # the plugin's own checks (trees, saved folders) before the model loads
    pipeline = default_pipeline(plugin_cls, model=plan.model, device=args.device)
    if spec is None:  # a pipeline registered without a spec: its flags are known once it is loaded
        parser = pipeline_flags_parser(args.plugin, type(pipeline).__name__, pipeline.add_cli_arguments)
        if args.help:
            return print_generate_help(args, parser)
        parse_pipeline_flags(args, parser, type(pipeline).__name__)
    # The loaded pipeline's own defaults (a bundled model may set other defaults than its class's spec).
    call, config = split_call_and_config(pipeline.call_defaults, plugin_cls.Config, args.plugin,
                                         parse_settings(args.set))
    accelerated = (plugin if spec is not None else plugin_cls(**config)).attach(pipeline)
    if args.compare:
        inputs, scored = accelerated.cli_inputs(args)  # unsupported pipelines fail before generating
    code = accelerated.cli_generate(args, call)
    if args.compare:
        print_comparison(accelerated, inputs, scored, args, call)
    return code


def print_generate_help(args, pipeline_parser: argparse.ArgumentParser) -> int:
    args.generate_parser.print_help()
    print()
    pipeline_parser.print_help()
    return 0


def print_comparison(accelerated, inputs: list, scored: bool, args, call: dict) -> None:
    """`generate --compare`: plain AR and the plugin on the same inputs and seeds, each timed warm."""
    import time

    baseline = get_plugin_class("ar")().attach(accelerated)
    runs = {}
    baseline.bench_generate(inputs[:1], 1, args.seed, call)  # warm-up; the plugin's run above warmed it
    for name, pipe in (("ar", baseline), ("plugin", accelerated)):
        begin = time.perf_counter()
        sequences, stats = pipe.bench_generate(inputs, args.batch_size, args.seed, call)
        runs[name] = (sequences, stats, time.perf_counter() - begin)
    (base_seq, base, base_s), (acc_seq, acc, acc_s) = runs["ar"], runs["plugin"]
    same = sum(a == b for a, b in zip(base_seq, acc_seq))
    greedy = call.get("temperature", 0.0) == 0
    print(f"\n{args.plugin} vs plain AR on the same {len(inputs)} inputs and seeds (batch {args.batch_size}):")
    print(f"  speed-up {base_s / max(acc_s, 1e-9):.2f}x ({base_s:.2f} s -> {acc_s:.2f} s); target forwards per "
          f"sample {base.nfe_per_sample:.1f} -> {acc.nfe_per_sample:.1f}; mean accepted {acc.mean_accepted:.2f}")
    lossless = accelerated.plugin is None or accelerated.plugin.lossless
    why = ("" if greedy and lossless else " (a lossy plugin: its quality cost is the figure to read)" if not lossless
           else " (sampling: a lossless plugin keeps the law, not the samples)")
    print(f"  outputs identical to AR: {same} of {len(inputs)}{why}")
    if acc.saves_nothing and accelerated.plugin is not None:
        print(f"  {args.plugin} saved no target forwards here: its drafts were almost never accepted (mean accepted "
              f"{acc.mean_accepted:.2f} tokens per forward, plain AR 1.00). To change that:")
        for hint in accelerated.plugin.advice_when_nothing_saved(call):
            print(f"    - {hint}")
    if scored:
        try:
            base_q = accelerated.bench_quality(inputs, base_seq)
            acc_q = accelerated.bench_quality(inputs, acc_seq)
        except ValueError as error:
            print(f"  quality: not measurable on {len(inputs)} inputs ({error}); raise --num")
            return
        from .bench import quality_comparison
        from .stats import paired_bootstrap, split_quality

        (base_q, base_parts), (acc_q, acc_parts) = split_quality(base_q), split_quality(acc_q)
        costs = paired_bootstrap(base_parts, acc_parts, seed=args.seed)
        shown = quality_comparison(base_q, acc_q, costs).replace(" → ", " -> ")
        print(f"  quality (AR -> plugin, n = {len(inputs)}{'; small n: mostly noise' if len(inputs) < 16 else ''}"
              f"{'; in brackets: the 95% interval of the difference' if costs else ''}): "
              f"{shown or 'none for this pipeline'}")
        if costs:
            print("  an interval that holds 0 means noise alone can explain the difference at this n")


def cmd_batch(args) -> int:
    preflight(args.plugin, args.model, args.set)
    check_counts(("--batch-size", args.batch_size))
    read_manifest(args.inputs, args.seed)  # every bad line, named before torch or any model loads
    check_device(args.device)
    quiet_weight_loading()

    import torch

    from .batch import run_batch
    from .bench import split_settings

    plugin_cls = get_plugin_class(args.plugin)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    state = None
    if args.engine == "local":
        from accelerate import PartialState

        state = PartialState(cpu=device == "cpu")  # cpu=True: a launch on CPU becomes gloo processes
        device = str(state.device) if device == "cuda" else "cpu"
    pipeline = default_pipeline(plugin_cls, model=args.model, device=device)
    call, config = split_settings(pipeline, plugin_cls, parse_settings(args.set))
    pipeline = plugin_cls(**config).attach(pipeline)
    options = {"num_workers": args.ray_workers, "device": device}
    summary = run_batch(pipeline, plugin=args.plugin, model=pipeline.model_name, inputs=args.inputs, out=args.out,
                        call=call, config=config, batch_size=args.batch_size, seed=args.seed, engine=args.engine,
                        engine_options=options if args.engine == "ray" else None, process_state=state,
                        progress=not args.quiet)
    if summary is not None:
        per = summary["per_sample"]
        print(f"{summary['samples']} samples in {args.out} (manifest.jsonl, summary.json); "
              f"target forwards per sample {per['nfe_per_sample']:.1f}, mean accepted {per['mean_accepted']:.2f}")
    return 0


def cmd_plan_tree(args) -> int:
    log = (lambda *_: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    preflight(args.plugin, args.model, args.set)
    check_device(args.device)
    for name in ("num_samples", "timing_samples", "batch_size", "max_nodes"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    quiet_weight_loading()
    from dataclasses import asdict

    from .tree_plan import format_plan, plan_tree

    plan = plan_tree(args.plugin, model=args.model, num_samples=args.num_samples,
                     timing_samples=args.timing_samples, batch_size=args.batch_size, max_nodes=args.max_nodes,
                     seed=args.seed, device=args.device, settings=parse_settings(args.set), progress=log)
    if args.json:
        Path(args.json).write_text(json.dumps({**asdict(plan), "best": asdict(plan.best)}, indent=2))
    print(format_plan(plan))
    return 0


def cmd_train_head(args) -> int:
    import importlib

    from .training import check_output_folder

    check_plugin_name(args.plugin)
    check_counts(("--steps", args.steps), ("--batch-size", args.batch_size), ("--num-sequences", args.num_sequences),
                 ("--num-heldout", args.num_heldout), ("--eval-every", args.eval_every))
    check_output_folder(args.out, overwrite=args.overwrite, overwrite_shipped=args.overwrite_shipped)
    check_device(args.device)
    quiet_weight_loading()
    plugin_cls = get_plugin_class(args.plugin)
    if plugin_cls.head_trainer is None:
        trainable = [s.name for s in plugin_summaries() if get_plugin_class(s.name).head_trainer]
        raise ValueError(f"plugin {args.plugin!r} has no weights to train; plugins with a trainer: "
                         f"{', '.join(trainable)}")
    module, _, function = plugin_cls.head_trainer.partition(":")
    trainer = getattr(importlib.import_module(module), function)
    pipeline = default_pipeline(plugin_cls, model=args.model, device=args.device)
    from .plugin import Plugin

    Plugin.check_pipeline(plugin_cls(), pipeline)  # the structure only: a plugin's own check may need the weights
    result = trainer(pipeline, args.out, steps=args.steps, batch_size=args.batch_size,
                     num_sequences=args.num_sequences, num_heldout=args.num_heldout, seed=args.seed,
                     eval_every=args.eval_every, work_dir=args.work_dir,
                     log=(lambda *_: None) if args.quiet else (lambda line: print(line, flush=True)))
    settings = " ".join(f"--set {k}={v}" for k, v in result["load_with"].items())
    model = f" --model {args.model}" if args.model else ""
    print(f"trained: mmspec generate {args.plugin}{model} {settings}  (Python: load_plugin({args.plugin!r}, "
          f"pipeline=pipe, {', '.join(f'{k}={v!r}' for k, v in result['load_with'].items())}))")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from mmspec import __version__

    parser = argparse.ArgumentParser(prog="mmspec", description="Speculative, Jacobi and parallel decoding "
                                     "for autoregressive generators of any modality.")
    parser.add_argument("--version", action="version", version=f"mmspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list registered plugins")
    p.add_argument("--modality", default=None)
    p.add_argument("--markdown", action="store_true", help="a markdown table: name, modality, lossless, method")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("bench", help="plain AR vs a plugin on the same model, inputs and seeds")
    p.add_argument("plugin", nargs="?", help="plugin name (see `mmspec list`)")
    p.add_argument("--all", action="store_true", help="bench every plugin with its defaults")
    p.add_argument("--only", default=None, metavar="P1,P2",
                   help="with --all: run only these plugins' rows and replace them in an existing --json")
    p.add_argument("--model", default=None, help="bundled model name, or a folder a pipeline's save_pretrained "
                   "wrote (default: the plugin's default)")
    p.add_argument("--num-samples", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--json", default=None, help="write the result JSON here")
    p.add_argument("--markdown", default=None, help="write a BENCHMARKS.md-style table here")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="pipeline setting (e.g. temperature=1) or plugin config (e.g. num_draft_tokens=4)")
    p.add_argument("--wide", action="store_true",
                   help="print every column (NFE and latency per side, lossless); BENCHMARKS.md always has them")
    p.add_argument("--refill", action="store_true",
                   help="samples/s with and without continuous batching at --batch-size (>= 2)")
    p.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                   help="compare compiled step forwards (torch.compile at static shapes, BACKEND default "
                        "inductor; aot_eager needs no C++ compiler) with eager ones, for AR and the plugin")
    p.add_argument("--profile", action="store_true",
                   help="also print where the time goes per decode step: draft / verify / accept / other, the "
                   "target's and drafter's forward costs, and what bounds the speed-up")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("plan-tree", help="plan a plugin's static draft tree for this machine (Sequoia-style: "
                       "measured acceptance by depth and rank, measured step cost)")
    p.add_argument("plugin", help="a tree-drafting plugin: eagle, lantern, lantern++, speculative, ssd, rvq_spec")
    p.add_argument("--model", default=None, help="as for bench")
    p.add_argument("--num-samples", type=int, default=16, help="calibration inputs (acceptance by depth and rank)")
    p.add_argument("--timing-samples", type=int, default=4, help="inputs each candidate decodes to time it "
                   "(step times vary ~5-10 %% between runs on a busy CPU: more samples, less noise)")
    p.add_argument("--batch-size", type=int, default=1, help="the batch size to plan for")
    p.add_argument("--max-nodes", type=int, default=24, help="the largest tree considered")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="pipeline settings (e.g. temperature=0) and plugin config, as for bench")
    p.add_argument("--json", default=None, help="write the plan (every candidate, the acceptance table) here")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_plan_tree)

    p = sub.add_parser("generate", help="generate with a plugin on the bundled model", add_help=False,
                       epilog="The bundled model's pipeline adds its own input flags; `mmspec generate PLUGIN "
                              "[--model NAME] --help` lists them.")
    p.add_argument("-h", "--help", action="store_true", help="show this help (with the pipeline's flags)")
    p.add_argument("plugin", nargs="?")
    p.add_argument("--model", default=None)
    p.add_argument("--num", type=int, default=4, help="number of samples when no prompt is given")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", default=None, help="output file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--compare", action="store_true",
                   help="also run plain AR on the same inputs and seeds: speed-up, forwards, identity, quality")
    p.set_defaults(func=cmd_generate, generate_parser=p)

    p = sub.add_parser("train-head", help="train a plugin's drafting weights (an EAGLE head, ...) for a pipeline",
                       description="Self-distillation on sequences the pipeline's own model samples: no dataset "
                                   "needed. The result loads with the printed --set / load_plugin setting.")
    p.add_argument("plugin", help="plugin name (see `mmspec list`; e.g. eagle, lantern, lantern++)")
    p.add_argument("--model", default=None, help="bundled model name, or a folder a pipeline's save_pretrained "
                   "wrote (default: the plugin's default)")
    p.add_argument("--out", required=True, metavar="DIR", help="new folder for the trained weights")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--num-sequences", type=int, default=256, help="sequences the model samples to train on")
    p.add_argument("--num-heldout", type=int, default=32, help="sequences the held-out figure is measured on")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--work-dir", default=None, help="keep samples and checkpoints here; a rerun resumes")
    p.add_argument("--overwrite", action="store_true", help="write into a non-empty --out folder")
    p.add_argument("--overwrite-shipped", action="store_true", help="replace weights mmspec ships (maintainers)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_train_head)

    p = sub.add_parser("batch", help="generate for every line of a JSONL manifest; resumable, multi-process",
                       description="Generate one output per manifest line. Several processes: `accelerate "
                       "launch --num_processes N -m mmspec batch ...`; many nodes: --engine ray. See "
                       "mmspec.common.batch for the files written.")
    p.add_argument("plugin", help="plugin name (see `mmspec list`)")
    p.add_argument("--model", default=None, help="bundled model name, or a folder a pipeline's save_pretrained "
                   "wrote (default: the plugin's default)")
    p.add_argument("--inputs", required=True, metavar="MANIFEST.jsonl",
                   help="one JSON object per line in the pipeline's input terms, optional 'id' and 'seed'")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0, help="sample i's seed when its line has none: seed + i")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda when visible, else cpu "
                   "(under a launcher, each process takes its own GPU)")
    p.add_argument("--engine", default="local", choices=["local", "ray"],
                   help="local: this process (or each process of an accelerate / torchrun launch); ray: a Ray "
                        "Data pipeline with one pipeline per actor")
    p.add_argument("--ray-workers", type=int, default=2, help="--engine ray: actors in the pool")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_batch)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "generate":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.pipeline_args = rest
    try:
        if getattr(args, "seed", None) is not None:  # every command that takes one, before its own work
            check_seed(args.seed)
        return args.func(args)
    except (ValueError, KeyError, NotImplementedError, FileNotFoundError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"mmspec {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
