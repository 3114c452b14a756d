"""Digests of every plugin's generated tokens on every bundled model it decodes: the before/after check of a
refactor that must not change outputs.

    python examples/output_digests.py --out after.json            # on the changed tree
    python examples/output_digests.py --out before.json           # on the old one (e.g. a git worktree)
    python examples/output_digests.py --compare before.json after.json

Each plugin decodes the same `--num` bench inputs of each model (`Pipeline.bench_inputs`) with the same
seed, greedy and at the pipeline's default sampling settings, through `bench_generate` (what `mmspec bench`
times); the digest is the SHA-256 of the token ids. Run both sides with the same thread count
(OMP_NUM_THREADS=1 by default here): CPU kernels round differently with another count.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MMSPEC_KERNELS", "torch")


def digests(num: int, seed: int) -> dict:
    import torch

    from mmspec import list_plugins, load_plugin
    from mmspec.common.registry import bundled_models, get_plugin_class

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    out = {}
    runs = []
    for name in list_plugins():
        for model in bundled_models(get_plugin_class(name).modality):
            try:
                runs.append((name, model, load_plugin(name, model=model)))
            except (ValueError, TypeError, NotImplementedError):  # a model whose tokens the plugin does not decode
                continue
    for name, model, pipe in runs:
        call = {**pipe.call_defaults, **pipe.bench_settings}
        inputs = pipe.bench_inputs(num, seed, **{k: call[k] for k in pipe.bench_input_settings})
        for label, settings in (("greedy", {"temperature": 0.0}), ("sampled", {})):
            if label == "greedy" and "temperature" not in call:
                continue
            sequences, stats = pipe.bench_generate(inputs, num, seed, {**call, **settings})
            text = json.dumps(sequences).encode()
            key = f"{name} on {model}, {label}"
            out[key] = {"sha256": hashlib.sha256(text).hexdigest(), "tokens": stats.tokens,
                        "target_nfe": stats.target_nfe}
            print(f"{key}: {out[key]}", file=sys.stderr, flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the digests here (JSON)")
    parser.add_argument("--num", type=int, default=2, help="bench inputs per plugin (one batch)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two digest files")
    args = parser.parse_args()
    if args.compare:
        before, after = (json.load(open(path)) for path in args.compare)
        same = [k for k in before if after.get(k) == before[k]]
        changed = [k for k in before if k in after and after[k] != before[k]]
        print(f"{len(same)} of {len(before)} runs bit-identical; changed: {changed or 'none'}; only before: "
              f"{sorted(set(before) - set(after)) or 'none'}; only after: {sorted(set(after) - set(before)) or 'none'}")
        return 0 if not changed and set(before) == set(after) else 1
    if not args.out:
        parser.error("give --out FILE (or --compare BEFORE AFTER)")
    result = digests(args.num, args.seed)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
