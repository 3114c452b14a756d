"""Train the bundled CTC + attention-decoder ASR model (speech/bundled/asr_tiny) on espeak-ng speech.

    python examples/make_asr_data.py                    # features -> runs/asr_data/train.pt (~3 min)
    python examples/train_asr.py --steps 3600           # ~75 min on 2 CPU cores; resumable

Open vocabulary (the shipped asr-tiny): examples/make_open_asr_data.py, then fine-tune the closed-vocabulary
model on it: python examples/train_asr.py --data runs/asr_open_data/train.pt --work-dir runs/asr_open \
--init speech/bundled/asr_tiny --steps 1250 --lr 8e-4 --warmup 100 --autocast none

Joint loss 0.3·CTC + 0.7·CE (label smoothing 0.1) with SpecAugment, AdamW, warm-up + cosine, bf16
autocast on CPU. Batches hold up to `--batch-frames` feature frames of similar-length utterances. A
checkpoint is written every `--checkpoint-every` steps; rerunning the same command resumes from it. The
same seed and data give the same weights.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch
import torch.nn.functional as F
import torchaudio

from mmspec.common.training import length_batches, load_checkpoint, save_checkpoint, warmup_cosine_lr
from mmspec.speech.asr_model import ASRModel
from mmspec.speech.text import CharTokenizer


def collate(data: dict, indices: list[int], model: ASRModel, tokenizer: CharTokenizer, augment, generator):
    offsets = data["offsets"]
    feats = [data["feats"][offsets[i]:offsets[i + 1]].float() for i in indices]
    lengths = torch.tensor([f.shape[0] for f in feats])
    x = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
    x = (x - model.feature_mean) / model.feature_std
    if augment is not None:
        x = augment(x.transpose(1, 2)).transpose(1, 2)  # masks are drawn from the global RNG (seeded)
    texts = [tokenizer.encode(data["texts"][i]) for i in indices]
    inputs = [torch.tensor([tokenizer.bos_id] + t) for t in texts]
    targets = [torch.tensor(t + [tokenizer.eos_id]) for t in texts]
    return (x, lengths, torch.nn.utils.rnn.pad_sequence(inputs, batch_first=True, padding_value=tokenizer.pad_id),
            torch.nn.utils.rnn.pad_sequence(targets, batch_first=True, padding_value=-100),
            [torch.tensor(t) for t in texts])


def joint_loss(model, batch, ctc_weight: float = 0.3, label_smoothing: float = 0.1):
    feats, lengths, inputs, targets, texts = batch
    enc, logits = model(feats, lengths, inputs)
    log_probs = enc.ctc_logits.float().log_softmax(-1).transpose(0, 1)  # [T, B, V]
    ctc = F.ctc_loss(log_probs, torch.cat(texts), enc.lengths, torch.tensor([len(t) for t in texts]),
                     blank=0, zero_infinity=True)
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100,
                         label_smoothing=label_smoothing)
    return ctc_weight * ctc + (1 - ctc_weight) * ce, ctc, ce


def feature_statistics(data: dict, sample: int = 2000) -> tuple[torch.Tensor, torch.Tensor]:
    step = max(1, data["feats"].shape[0] // (sample * 100))
    frames = data["feats"][::step].float()
    return frames.mean(0), frames.std(0).clamp(min=1e-3)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="runs/asr_data/train.pt")
    parser.add_argument("--work-dir", default="runs/asr")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "speech", "bundled",
                                                       "asr_tiny"))
    parser.add_argument("--steps", type=int, default=3600)
    parser.add_argument("--batch-frames", type=int, default=12000, help="padded feature frames per batch")
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--checkpoint-every", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default="", help="comma list of ASRModel overrides, e.g. decoder_layers=2")
    parser.add_argument("--autocast", choices=("bf16", "none"), default="bf16",
                        help="bf16 autocast (fast where the CPU has bf16 matrix units) or plain float32 (CPUs "
                             "without them run bf16 matmuls ~100x slower)")
    parser.add_argument("--init", default=None,
                        help="start from this saved model (e.g. speech/bundled/asr_tiny) instead of random "
                             "weights; its feature normalisation is kept")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    overrides = {k: int(v) for k, v in (kv.split("=") for kv in args.config.split(",") if kv)}
    data = torch.load(args.data)
    if args.init is not None:
        if overrides:
            raise ValueError("--config cannot change a model given by --init")
        model = ASRModel.from_pretrained(args.init).float()
    else:
        model = ASRModel(**overrides)
        model.feature_mean.copy_(feature_statistics(data)[0])
        model.feature_std.copy_(feature_statistics(data)[1])
    tokenizer = CharTokenizer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    augment = torch.nn.Sequential(torchaudio.transforms.FrequencyMasking(15),
                                  torchaudio.transforms.FrequencyMasking(15),
                                  torchaudio.transforms.TimeMasking(40, p=0.1),
                                  torchaudio.transforms.TimeMasking(40, p=0.1))
    lengths = (data["offsets"][1:] - data["offsets"][:-1]).tolist()

    os.makedirs(args.work_dir, exist_ok=True)
    checkpoint = os.path.join(args.work_dir, "checkpoint.pt")
    step = 0
    saved = load_checkpoint(checkpoint, model, optimizer)
    if saved is not None:
        step = saved["step"]
        print(f"resumed at step {step}")

    epoch_batches, epoch = [], -1
    position = step  # batches are a pure function of (seed, epoch): resuming lands on the same batch
    model.train()
    start, log = time.time(), []
    while step < args.steps:
        epoch_of_step, index = 0, position
        while True:
            if epoch_of_step != epoch:
                epoch, epoch_batches = epoch_of_step, length_batches(lengths, args.batch_frames,
                                                                     random.Random(args.seed * 1000 + epoch_of_step))
            if index < len(epoch_batches):
                break
            index -= len(epoch_batches)
            epoch_of_step += 1
        batch = collate(data, epoch_batches[index], model, tokenizer, augment, None)
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine_lr(step, args.steps, args.lr, args.warmup)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            loss, ctc, ce = joint_loss(model, batch)
        ctc, ce = ctc.detach(), ce.detach()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        step, position = step + 1, position + 1
        log.append((ctc.item(), ce.item()))
        if step % 50 == 0:
            c, e = (sum(v) / len(log) for v in zip(*log))
            print(f"step {step} epoch {epoch} ctc {c:.3f} ce {e:.3f} lr {optimizer.param_groups[0]['lr']:.2e} "
                  f"{(time.time() - start) / len(log):.2f} s/step", flush=True)
            log, start = [], time.time()
        if step % args.checkpoint_every == 0 or step == args.steps:
            save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                             "torch_rng": torch.get_rng_state()}, checkpoint)

    model.eval()
    model.to(torch.float16).save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
