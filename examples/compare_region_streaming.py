"""layout+regions with and without streaming, on the same pages, run alternately batch by batch (machine-load
drift hits both alike): pages/s, decode and prefill forwards per page, and whether the outputs are identical.

    python examples/compare_region_streaming.py --plugin ptp --batch-size 4 --num 48

Streaming (`stream=None`, the default where the plugin admits rows) starts each block's region row while the
layout pass still runs; `stream=False` runs the layout pass to its end first (docs/documents.md).
"""

from __future__ import annotations

import argparse
import time
import warnings

from mmspec import load_plugin
from mmspec.docs_parse.pages import load_held_out_set


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plugin", default="ptp", help="a document plugin (ar, ptp)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--num", type=int, default=48, help="held-out pages (at most 48)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="plugin config")
    args = parser.parse_args()
    held_out = load_held_out_set()
    if not 1 <= args.num <= len(held_out):
        parser.error(f"--num must be in [1, {len(held_out)}], got {args.num}")
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")
    from mmspec.common.registry import parse_value

    config = {k: parse_value(v) for k, v in (pair.split("=", 1) for pair in args.set)}
    pipe = load_plugin(args.plugin, model="doc-tiny", **config)
    pipe.set_progress_bar_config(disable=True)
    pages = [row["image"] for row in held_out[:args.num]]
    warnings.simplefilter("ignore")  # pages cut at max_new_tokens are counted alike on both sides
    pipe(pages[:args.batch_size], mode="layout+regions", batch_size=args.batch_size)  # warm-up
    totals = {stream: {"seconds": 0.0, "forwards": 0, "prefills": 0, "sequences": []} for stream in (False, None)}
    for start in range(0, args.num, args.batch_size):
        chunk = pages[start:start + args.batch_size]
        for stream, total in totals.items():
            begin = time.perf_counter()
            out = pipe(chunk, mode="layout+regions", batch_size=args.batch_size, stream=stream)
            total["seconds"] += time.perf_counter() - begin
            total["forwards"] += out.stats.target_nfe
            total["prefills"] += out.stats.prefill_nfe
            total["sequences"] += out.sequences
    same = totals[False]["sequences"] == totals[None]["sequences"]
    print(f"{args.plugin} {config or ''} layout+regions, batch {args.batch_size}, {args.num} pages; "
          f"outputs identical: {same}")
    for stream, total in totals.items():
        name = "streamed  " if stream is None else "two passes"
        print(f"  {name} {args.num / total['seconds']:.2f} pages/s, decode forwards/page "
              f"{total['forwards'] / args.num:.1f}, prefill forwards/page {total['prefills'] / args.num:.1f}")


if __name__ == "__main__":
    main()
