"""Train the bundled residual-VQ spectral codec on the Piper speech of examples/make_tts_data.py.

    python examples/make_tts_data.py                   # runs/tts_data/shard_*.npz
    python examples/train_codec.py                     # runs/codec/checkpoint.pt -> runs/codec/final

Batches are random 1.28 s crops (32 code frames) drawn from a generator seeded by (seed, step), so a run
resumed from its checkpoint (written every `--checkpoint-every` steps, with the RNG state the EMA codebook
restarts draw from) ends with the same weights as an uninterrupted one. Half of each batch uses quantizer
dropout (a random number of levels), so codebook 0 carries the coarse content and finer levels refine it.
fp32 throughout: the VQ's nearest-code search is not safe in bf16.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import time

import numpy as np
import torch

from mmspec.common.training import RunningLosses, load_checkpoint, optimizer_step, save_checkpoint
from mmspec.speech.codec import SpectralRVQCodec
from mmspec.speech.tts_data import load_shards


def crop_batch(waves: list[np.ndarray], batch_size: int, crop: int, generator: torch.Generator):
    """(waves [B, crop] float32, lengths [B]): random utterances, random offsets (short ones padded)."""
    picks = torch.randint(0, len(waves), (batch_size,), generator=generator).tolist()
    out = torch.zeros(batch_size, crop)
    lengths = torch.zeros(batch_size, dtype=torch.long)
    for row, index in enumerate(picks):
        wave = waves[index]
        start = int(torch.randint(0, max(1, len(wave) - crop + 1), (1,), generator=generator))
        piece = torch.from_numpy(wave[start:start + crop].astype(np.float32) / 32768.0)
        out[row, : len(piece)] = piece
        lengths[row] = len(piece)
    return out, lengths


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="runs/tts_data")
    parser.add_argument("--num-shards", type=int, default=4, help="train on the first N shards (500 utterances "
                        "each; 4 = about 1.5 h of speech, plenty for the codec)")
    parser.add_argument("--work-dir", default="runs/codec")
    parser.add_argument("--out", default="runs/codec/final", help="examples/train_tts.py reads it from here and "
                        "ships it inside the TTS bundle (speech/bundled/tts_tiny/codec, fp16)")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--crop-frames", type=int, default=32, help="code frames per training crop")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-after", type=int, default=None, help="stop (checkpointed) after this step, as an "
                        "interruption would; rerun without it to resume")
    parser.add_argument("--config", default="{}", help="JSON SpectralRVQCodec overrides, e.g. '{\"dim\": 64}'")
    args = parser.parse_args(argv)

    shards = sorted(glob.glob(os.path.join(args.data, "shard_*.npz")))[: args.num_shards]
    if len(shards) < args.num_shards:
        raise SystemExit(f"{args.data} has {len(shards)} shards, --num-shards asks for {args.num_shards}: run "
                         "examples/make_tts_data.py first")
    waves, _ = load_shards(shards)
    print(f"{len(waves)} utterances, {sum(map(len, waves)) / 16000 / 3600:.2f} h")

    torch.manual_seed(args.seed)
    model = SpectralRVQCodec(**json.loads(args.config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.8, 0.99), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (
        1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    os.makedirs(args.work_dir, exist_ok=True)
    checkpoint = os.path.join(args.work_dir, "checkpoint.pt")
    step = 0
    saved = load_checkpoint(checkpoint, model, optimizer, schedule)
    if saved is not None:
        step = saved["step"]
        print(f"resumed at step {step}")

    crop = args.crop_frames * model.samples_per_frame
    model.train()
    start, running = time.time(), RunningLosses()
    while step < args.steps:
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        batch, lengths = crop_batch(waves, args.batch_size, crop, generator)
        levels = torch.randint(1, model.num_codebooks + 1, (args.batch_size,), generator=generator)
        levels[torch.rand(args.batch_size, generator=generator) < 0.5] = model.num_codebooks
        losses = model.reconstruction_losses(batch, lengths, levels)
        optimizer_step(losses["loss"], model, optimizer, schedule)
        step += 1
        running.add(losses)
        if step % 50 == 0:
            print(f"step {step} {running.report(4)} ({time.time() - start:.0f} s)", flush=True)
        if step % args.checkpoint_every == 0 or step in (args.steps, args.stop_after):
            save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "schedule": schedule.state_dict(), "step": step, "torch_rng": torch.get_rng_state()},
                            checkpoint)
        if args.stop_after is not None and step >= args.stop_after and step < args.steps:
            print(f"stopped at step {step} (--stop-after)")
            return
    model.eval()
    model.save_pretrained(args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
