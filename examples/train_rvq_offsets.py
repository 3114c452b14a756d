"""Train `rvq_spec`'s offset vectors by self-distillation on a TTS model's own depth-decoder states.

    python examples/train_rvq_offsets.py --out plugins/rvq_spec/bundled/tts_tiny_offsets --overwrite-shipped  # tts-tiny
    python examples/train_rvq_offsets.py --model path/to/tts_pipeline_folder --out my_offsets
    mmspec bench rvq_spec --set offsets=my_offsets             # then draft with them

1. Frames: the model speaks `--num-texts` training sentences (never the held-out ones) at the deployed
   sampling settings, and every frame's backbone state and codes are kept (`--work-dir`/frames.pt).
2. States: the depth decoder runs teacher-forced over those codes once (`--work-dir`/states.pt).
3. Offsets (one set per source level unless `--shared`): Adam on `mmspec.plugins.rvq_spec.training.offset_losses`
   (`--objective tv`, the default: one minus the acceptance rate of the processed pair; `kl`: KL of the
   tempered distributions; tv did better on tts-tiny, see docs/tts.md), batches drawn
   from a generator seeded by (seed, step); checkpoints every `--checkpoint-every` steps, so an interrupted run
   resumes (rerun the same command) to the same offsets. Frames of `--num-validation` further texts validate; their
   acceptance per draft distance (the overlap Σ min(p̃, q̃) of the processed distributions,
   the rate at which speculative sampling keeps a draft) is printed for the offsets and for none (head-ahead drafting).

Only the offsets train: the model is frozen, so the plugin stays lossless whatever they learn. For a model
other than a `TTSPipeline` folder (e.g. a Qwen3-Omni code predictor), collect frames your own way and call
`depth_states` / `offset_losses` with your `RVQDepthModel` adapter; the loop below is the whole recipe.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from mmspec.common.training import check_output_folder, save_checkpoint, warmup_cosine_lr
from mmspec.plugins.rvq_spec import BUNDLED_OFFSETS, RVQOffsets
from mmspec.plugins.rvq_spec.training import collect_frames, depth_states, offset_losses


def load_pipeline(model: str):
    from mmspec.speech.tts_pipeline import TTSPipeline, bundled_pipeline

    return bundled_pipeline() if model == "tts-tiny" else TTSPipeline.from_pretrained(model)


def frames_and_states(pipe, args) -> dict:
    """Frames and teacher-forced states, cached in the work dir (collection is the slow part)."""
    from mmspec.speech.tts_data import tts_sentences
    from mmspec.speech.tts_model import DepthDecoderAR

    path = os.path.join(args.work_dir, "states.pt")
    if os.path.exists(path):
        return torch.load(path)
    frames_path = os.path.join(args.work_dir, "frames.pt")
    train_texts, _ = tts_sentences()
    texts = train_texts[: args.num_texts + args.num_validation]  # the last num_validation: validation frames
    if os.path.exists(frames_path):
        parts = torch.load(frames_path)
    else:
        parts = {"done": 0, "hidden": [], "codes": [], "text_of_frame": []}
    while parts["done"] < len(texts):  # in chunks, saved after each: an interrupted collection resumes
        start = parts["done"]
        end = min(start + 64, args.num_texts if start < args.num_texts else len(texts))  # never across the split
        begin = time.time()
        frames = collect_frames(pipe, texts[start:end], seed=args.seed + start, batch_size=16,
                                max_new_frames=args.max_frames)
        parts["hidden"].append(frames["hidden"].half())
        parts["codes"].append(frames["codes"].short())
        # Frames of a chunk belong to its texts; the chunk's first text index marks them (validation split).
        parts["text_of_frame"].append(torch.full((len(frames["codes"]),), start))
        parts["done"] = end
        save_checkpoint(parts, frames_path)
        print(f"frames: {parts['done']}/{len(texts)} texts, {sum(len(c) for c in parts['codes'])} frames "
              f"({time.time() - begin:.0f} s for this chunk)", flush=True)
    hidden = torch.cat(parts["hidden"]).float()
    codes = torch.cat(parts["codes"]).long()
    text_of_frame = torch.cat(parts["text_of_frame"])
    size = pipe.codec.codebook_size
    states = depth_states(lambda h: DepthDecoderAR(pipe.model.depth_decoder, h, size), hidden, codes)
    data = {"states": states.half(), "validation": text_of_frame >= args.num_texts}
    save_checkpoint(data, path)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tts-tiny", help="'tts-tiny' or a TTSPipeline folder")
    parser.add_argument("--work-dir", default="runs/rvq_offsets")
    parser.add_argument("--out", required=True, help=f"where the offsets are saved (the shipped ones: {BUNDLED_OFFSETS})")
    parser.add_argument("--overwrite-shipped", action="store_true", help="replace the shipped offsets")
    parser.add_argument("--num-texts", type=int, default=640)
    parser.add_argument("--num-validation", type=int, default=64, help="further texts whose frames validate")
    parser.add_argument("--max-frames", type=int, default=250)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-frames", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--temperature", type=float, default=0.9, help="the deployed depth temperature")
    parser.add_argument("--shared", action="store_true", help="one offset set for every source level (the "
                        "paper's form; default: one set per source level)")
    parser.add_argument("--objective", choices=("kl", "tv"), default="tv",
                        help="kl: tempered distributions; tv: one minus the acceptance rate itself")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--stop-after", type=int, default=None, help="stop (checkpointed) after this step, as an "
                        "interruption would; rerun without it to resume")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out
    try:
        check_output_folder(out, overwrite=True, overwrite_shipped=args.overwrite_shipped,
                            parent_must_exist=False)
    except ValueError as error:
        parser.error(str(error))
    os.makedirs(args.work_dir, exist_ok=True)
    torch.manual_seed(args.seed)

    pipe = load_pipeline(args.model)
    from mmspec.speech.tts_model import DepthDecoderAR

    data = frames_and_states(pipe, args)
    states = data["states"].float()
    validation = data["validation"]
    train_states, valid_states = states[~validation], states[validation]
    config = pipe.model.depth_decoder.config
    target = DepthDecoderAR(pipe.model.depth_decoder, torch.zeros(1, pipe.model.config.hidden_size),
                            pipe.codec.codebook_size)
    for parameter in pipe.model.parameters():
        parameter.requires_grad_(False)
    offsets = RVQOffsets(hidden_size=config.hidden_size, num_codebooks=config.num_codebooks, per_level=not args.shared)
    optimizer = torch.optim.Adam(offsets.parameters(), lr=args.lr)
    checkpoint_path = os.path.join(args.work_dir, "checkpoint.pt")
    step = 0
    if os.path.exists(checkpoint_path):
        saved = torch.load(checkpoint_path)
        offsets.load_state_dict(saved["offsets"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
        print(f"resumed at step {step}")
    print(f"{len(train_states)} training frames, {len(valid_states)} validation frames, "
          f"{offsets.offsets.numel()} trained parameters")

    def validate(module) -> str:
        with torch.no_grad():
            result = offset_losses(target, module, valid_states, args.temperature)
        return (f"kl {float(result['loss']):.3f} acceptance by distance "
                + " ".join(f"{a:.3f}" for a in result["acceptance"].tolist()))

    if step == 0:
        print("validation, no offsets (head-ahead):", validate(None), flush=True)
    begin = time.time()
    while step < args.steps:
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine_lr(step, args.steps, args.lr, warmup=20)
        batch_rng = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        rows = torch.randint(0, len(train_states), (args.batch_frames,), generator=batch_rng)
        losses = offset_losses(target, offsets, train_states[rows], args.temperature, objective=args.objective)
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        optimizer.step()
        step += 1
        if step % 50 == 0:
            print(f"step {step} loss {float(losses['loss'].detach()):.4f} ({time.time() - begin:.0f} s)", flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            save_checkpoint({"offsets": offsets.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                            checkpoint_path)
            if args.stop_after is not None and step >= args.stop_after:
                print(f"stopped after step {step} (checkpointed)")
                return
    print("validation, learned offsets:", validate(offsets), flush=True)
    offsets.save_pretrained(out)
    print(f"saved {out}")


if __name__ == "__main__":
    main()
