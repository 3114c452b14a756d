"""Train the bundled two-level codec TTS model (a small `CsmForConditionalGeneration`) on the Piper speech.

    python examples/make_tts_data.py                   # runs/tts_data/shard_*.npz
    python examples/train_codec.py                     # runs/codec/final
    python examples/train_tts.py                       # runs/tts/checkpoint.pt -> speech/bundled/tts_tiny

First the shards are encoded with the codec (cached in `--work-dir`/codes.pt); then batches of similar-length
utterances (up to `--batch-positions` backbone positions) are drawn from an RNG seeded by (seed, epoch), so a
run resumed from its checkpoint (every `--checkpoint-every` steps) ends with the same weights as an
uninterrupted one. bf16 autocast on CPU. The losses are in `mmspec.speech.tts_model.training_losses`.
At every checkpoint the teacher-forced loss on validation utterances (the corpus's last `--num-validation`,
never trained on; the test sentences are never used) is measured and the best weights so far are kept; those
ship (a model this size overfits 3 h of speech within a few epochs: without
frame-input dropout, held-out backbone loss was 4.0 at step 1 400 while the training loss was 1.1).
The shipped folder holds the model, the tokenizer and a copy of the codec: everything `TTSPipeline` loads.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import time

import torch

from mmspec.common.training import (RunningLosses, batch_of_step, length_batches, load_checkpoint, optimizer_step,
                                    save_checkpoint)
from mmspec.speech.codec import SpectralRVQCodec
from mmspec.speech.text import CharTokenizer
from mmspec.speech.tts_data import load_shards
from mmspec.speech.tts_model import tiny_csm_config, training_losses

BUNDLED = os.path.join(os.path.dirname(__file__), "..", "speech", "bundled")


def encode_corpus(shards: list[str], codec: SpectralRVQCodec, tokenizer: CharTokenizer, batch_size: int = 16):
    """{"codes": [T_i, K] int16 per utterance, "text": [ids] per utterance} for every utterance of the shards."""
    waves, texts = load_shards(shards)
    order = sorted(range(len(waves)), key=lambda i: len(waves[i]))
    codes = [None] * len(waves)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = torch.nn.utils.rnn.pad_sequence(
            [torch.from_numpy(waves[i].astype("float32") / 32768.0) for i in chunk], batch_first=True)
        lengths = torch.tensor([len(waves[i]) for i in chunk])
        out, frames = codec.encode(batch, lengths)
        for row, i in enumerate(chunk):
            codes[i] = out[row, :, : int(frames[row])].T.to(torch.int16).clone()
    text = [[tokenizer.bos_id] + tokenizer.encode(t) + [tokenizer.eos_id] for t in texts]
    return {"codes": codes, "text": text}


@torch.no_grad()
def held_out_loss(model, batch) -> float:
    """Backbone + depth-decoder cross-entropy on the validation batch (all frames; no guided-attention term)."""
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = training_losses(model, *batch, depth_fraction=1.0, generator=torch.Generator().manual_seed(0))
    model.train()
    return float(losses["backbone"] + losses["depth"])


def collate(data: dict, indices: list[int]):
    text = [torch.tensor(data["text"][i]) for i in indices]
    codes = [data["codes"][i].long() for i in indices]
    return (torch.nn.utils.rnn.pad_sequence(text, batch_first=True), torch.tensor([len(t) for t in text]),
            torch.nn.utils.rnn.pad_sequence(codes, batch_first=True), torch.tensor([len(c) for c in codes]))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="runs/tts_data")
    parser.add_argument("--codec", default="runs/codec/final", help="the trained codec (examples/train_codec.py)")
    parser.add_argument("--work-dir", default="runs/tts")
    parser.add_argument("--num-validation", type=int, default=100, help="utterances (the corpus's last) kept out "
                        "of training to pick the checkpoint that ships; the test sentences are never used for it")
    parser.add_argument("--out", default=os.path.join(BUNDLED, "tts_tiny"))
    parser.add_argument("--steps", type=int, default=1800)
    parser.add_argument("--batch-positions", type=int, default=3072, help="padded backbone positions per batch")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--frame-dropout", type=float, default=0.3, help="dropout on the backbone's frame inputs")
    parser.add_argument("--attention-dropout", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-after", type=int, default=None, help="stop (checkpointed) after this step, as an "
                        "interruption would; rerun without it to resume")
    parser.add_argument("--config", default="{}", help="JSON tiny_csm_config overrides, e.g. '{\"num_layers\": 2}'")
    args = parser.parse_args(argv)

    from transformers import CsmForConditionalGeneration

    codec = SpectralRVQCodec.from_pretrained(args.codec, torch_dtype=torch.float32).eval()
    tokenizer = CharTokenizer()
    os.makedirs(args.work_dir, exist_ok=True)
    cache = os.path.join(args.work_dir, "codes.pt")
    if os.path.exists(cache):
        data = torch.load(cache)
    else:
        shards = sorted(glob.glob(os.path.join(args.data, "shard_*.npz")))
        if not shards:
            raise SystemExit(f"no shards in {args.data}: run examples/make_tts_data.py first")
        start = time.time()
        data = encode_corpus(shards, codec, tokenizer)
        torch.save(data, cache)
        print(f"encoded {len(data['codes'])} utterances in {time.time() - start:.0f} s")
    sizes = [len(t) + len(c) for t, c in zip(data["text"], data["codes"])]
    print(f"{len(sizes)} utterances, {sum(len(c) for c in data['codes']) / codec.frame_rate / 3600:.2f} h, "
          f"longest sequence {max(sizes)}")

    torch.manual_seed(args.seed)
    config = tiny_csm_config(num_codebooks=codec.num_codebooks, codebook_size=codec.codebook_size,
                             text_vocab_size=tokenizer.vocab_size, **json.loads(args.config))
    config._attn_implementation = "eager"  # the guided-attention loss reads attention weights
    config.attention_dropout = args.attention_dropout
    model = CsmForConditionalGeneration(config)
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98),
                                  weight_decay=args.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / args.warmup) * max(
        0.05, 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))))
    checkpoint = os.path.join(args.work_dir, "checkpoint.pt")
    best_path = os.path.join(args.work_dir, "best.pt")
    if not 1 <= args.num_validation < len(sizes):
        raise SystemExit(f"--num-validation must be in 1..{len(sizes) - 1} (the corpus has {len(sizes)} utterances)")
    validation = list(range(len(sizes) - args.num_validation, len(sizes)))
    held_out = collate(data, validation)
    train_sizes = sizes[: len(sizes) - args.num_validation]
    step, best = 0, {"loss": float("inf"), "step": 0}
    saved = load_checkpoint(checkpoint, model, optimizer, schedule)  # its RNG state: attention dropout
    if saved is not None:
        step, best = saved["step"], saved["best"]
        print(f"resumed at step {step} (best held-out loss {best['loss']:.3f} at step {best['step']})")

    model.train()
    epochs = {}

    def epoch_batches(epoch: int) -> list[list[int]]:  # a pure function of (seed, epoch)
        if epoch not in epochs:
            epochs[epoch] = length_batches(train_sizes, args.batch_positions, random.Random(args.seed * 1000 + epoch))
        return epochs[epoch]

    start, running = time.time(), RunningLosses()
    while step < args.steps:
        _, indices = batch_of_step(step, epoch_batches)
        text, text_lengths, codes, frame_lengths = collate(data, indices)
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses = training_losses(model, text, text_lengths, codes, frame_lengths, generator=generator,
                                     frame_dropout=args.frame_dropout)
        optimizer_step(losses["loss"], model, optimizer, schedule)
        step += 1
        running.add(losses)
        if step % 25 == 0:
            print(f"step {step} {running.report(3)} ({time.time() - start:.0f} s)", flush=True)
        if step % args.checkpoint_every == 0 or step in (args.steps, args.stop_after):
            loss = held_out_loss(model, held_out)
            print(f"step {step} held-out loss {loss:.3f}", flush=True)
            if loss < best["loss"]:
                best = {"loss": loss, "step": step}
                save_checkpoint(model.state_dict(), best_path)
            save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "schedule": schedule.state_dict(), "step": step, "best": best,
                             "torch_rng": torch.get_rng_state()}, checkpoint)
        if args.stop_after is not None and step >= args.stop_after and step < args.steps:
            print(f"stopped at step {step} (--stop-after)")
            return
    model.load_state_dict(torch.load(best_path))
    print(f"shipping the step-{best['step']} weights (held-out loss {best['loss']:.3f})")
    model.eval()
    model.config._attn_implementation = "sdpa"
    model.config.attention_dropout = 0.0
    from mmspec.speech.tts_pipeline import save_tts_bundle

    save_tts_bundle(args.out, model, tokenizer, codec)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
