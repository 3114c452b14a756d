"""Batch generation with any plugin, sharded over processes and resumable.

Single process:            python examples/batch_generate.py --plugin speculative --prompts prompts.txt --out out/
Several GPUs / processes:  accelerate launch --num_processes 4 examples/batch_generate.py ... (or torchrun)

Every sample i uses generator seed + i, so results do not depend on the number
of processes or the batch size. Each sample is written to out/NNNNNN.json as
soon as its batch is done, existing files are skipped (resume after a crash),
and rank 0 merges everything into out/manifest.jsonl with summed DecodeStats.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from accelerate import PartialState

from mmspec import load_plugin
from mmspec.common.bench import parse_settings, split_settings
from mmspec.common.registry import get_plugin_class
from mmspec.common.stats import DecodeStats
from mmspec.text.pipeline import bench_prompts


def read_prompts(args) -> list[str]:
    if args.prompts:
        lines = Path(args.prompts).read_text().splitlines()
        return [line for line in lines if line.strip()]
    return bench_prompts(args.num)


def sample_path(out: Path, index: int) -> Path:
    return out / f"{index:06d}.json"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plugin", default="speculative")
    parser.add_argument("--prompts", default=None, help="text file, one prompt per line")
    parser.add_argument("--num", type=int, default=16, help="bundled prompts to use when --prompts is absent")
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    state = PartialState()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = read_prompts(args)
    plugin_cls = get_plugin_class(args.plugin)
    pipe = plugin_cls.default_pipeline(device=str(state.device) if state.device.type == "cuda" else "cpu")
    call, config = split_settings(pipe, plugin_cls, parse_settings(args.set))
    pipe = load_plugin(args.plugin, pipeline=pipe, **config)

    todo = [i for i in range(len(prompts)) if not sample_path(out, i).exists()]
    stats = DecodeStats()
    with state.split_between_processes(todo) as mine:
        for start in range(0, len(mine), args.batch_size):
            indices = mine[start:start + args.batch_size]
            gens = [torch.Generator().manual_seed(args.seed + i) for i in indices]
            result = pipe([prompts[i] for i in indices], generator=gens, **call)
            stats = stats.merge(result.stats)
            for i, text, seq in zip(indices, result.texts, result.sequences):
                record = {"index": i, "prompt": prompts[i], "completion": text, "tokens": seq}
                sample_path(out, i).write_text(json.dumps(record))
    (out / f"stats.rank{state.process_index}.json").write_text(json.dumps(stats.to_dict()))
    state.wait_for_everyone()
    if state.is_main_process:
        with open(out / "manifest.jsonl", "w") as manifest:
            for i in range(len(prompts)):
                manifest.write(sample_path(out, i).read_text() + "\n")
        print(f"{len(prompts)} samples in {out}; this run: {stats}")


if __name__ == "__main__":
    main()
