"""Train the bundled page VLM (a small `GotOcr2ForConditionalGeneration`) on rendered pages.

    python examples/train_doc_vlm.py                  # runs/doc_vlm/checkpoint.pt -> docs_parse/bundled/doc_tiny
    python examples/train_doc_vlm.py --steps 20 --out /tmp/doc --work-dir /tmp/doc_run   # smoke run

The shipped weights: `--steps 3300` (batch 16, lr 1e-3), best validation loss 1.825 at step 3200. That run was
extended across sessions (steps 0-300 under a 2000-step schedule, 300-1800 under 1800, then 1800-3300 as a
warm restart), so rerunning this command from scratch gives a clean cosine rather than the same weights.

1. Tokenizer: a byte-level BPE trained on the markdown of `--tokenizer-pages` training pages (cached in the
   work dir), the control tokens first (mmspec.docs_parse.model.CONTROL_TOKENS).
2. Model: `tiny_got_config` (320 px pages, 64 image tokens; a 3-layer ViT, a 4-layer Qwen2 decoder).
3. Steps: global step s trains on training pages s·B … s·B + B − 1, each under one of the three prompts drawn
   from its seed (page 40 %, layout 20 %, region 40 %), rendered on the fly by one loader worker. Cross-entropy
   on the target tokens, AdamW, warm-up + cosine, bf16 autocast on CPU. Every `--checkpoint-every` steps a
   checkpoint (weights, optimizer, step) is written atomically and the teacher-forced loss on
   `--num-validation` pages of the training layout stream's far end (never trained on; the test split is
   never used) is measured; the best weights so far are what ships. A resumed run (same command) ends with
   the same weights as an uninterrupted one.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from mmspec.common.training import (RunningLosses, load_checkpoint, optimizer_step, save_checkpoint,
                                    warmup_cosine_lr)
from mmspec.docs_parse.model import PageImageProcessor, PagePrompts, tiny_got_config, train_tokenizer
from mmspec.docs_parse.pages import page_markdown, render_page
from mmspec.docs_parse.training import collate, training_example

BUNDLED = os.path.join(os.path.dirname(__file__), "..", "docs_parse", "bundled", "doc_tiny")
VALIDATION_SEED0 = 50_000_000  # validation pages: the training stream's far end, never reached by training


class PageSteps(torch.utils.data.Dataset):
    """Item s = the collated batch of global step s (so a resumed run sees the same batches)."""

    def __init__(self, prompts, processor, batch_size, first_seed=0, max_length=448):
        self.prompts, self.processor, self.batch_size = prompts, processor, batch_size
        self.first_seed, self.max_length = first_seed, max_length

    def __len__(self):
        return 10 ** 9

    def __getitem__(self, step):
        start = self.first_seed + step * self.batch_size
        examples = [training_example(start + i, self.prompts, max_length=self.max_length)
                    for i in range(self.batch_size)]
        return collate(examples, self.processor, self.prompts.tokenizer.pad_token_id)


def loss_of(model, batch):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    pixel_values=batch["pixel_values"], labels=batch["labels"])
    return out.loss


@torch.no_grad()
def validation_loss(model, batches) -> float:
    model.eval()
    total = sum(float(loss_of(model, b)) for b in batches) / len(batches)
    model.train()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", default="runs/doc_vlm")
    parser.add_argument("--out", default=BUNDLED)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--tokenizer-pages", type=int, default=2000)
    parser.add_argument("--num-validation", type=int, default=64)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--stop-after", type=int, default=None, help="stop after this many steps of this run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.work_dir, exist_ok=True)

    tok_dir = os.path.join(args.work_dir, "tokenizer")
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        texts = [page_markdown(render_page(s, augment=False).blocks) for s in range(args.tokenizer_pages)]
        train_tokenizer(texts).save_pretrained(tok_dir)
    from transformers import GotOcr2ForConditionalGeneration, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    config = tiny_got_config(vocab_size=64 * -(-len(tokenizer) // 64),
                             image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                             pad_token_id=tokenizer.pad_token_id)
    prompts = PagePrompts(tokenizer, config.image_seq_length)
    processor = PageImageProcessor()
    torch.manual_seed(args.seed)
    model = GotOcr2ForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine_lr(s, args.steps, 1.0, warmup=min(200, args.steps // 10 + 1)))
    ckpt_path = os.path.join(args.work_dir, "checkpoint.pt")
    step, best = 0, {"loss": float("inf"), "step": -1, "state": None}
    saved = load_checkpoint(ckpt_path, model, optimizer, schedule)
    if saved is not None:
        step, best = saved["step"], saved["best"]
        print(f"resumed at step {step}", flush=True)
    valid = PageSteps(prompts, processor, 16, first_seed=VALIDATION_SEED0)
    valid_batches = [valid[i] for i in range(max(1, args.num_validation // 16))]
    data = PageSteps(prompts, processor, args.batch_size)
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(data, range(step, args.steps)), batch_size=None,
                                         num_workers=1, prefetch_factor=4, persistent_workers=False)
    model.train()
    running, begin, run_steps = RunningLosses(), time.time(), 0
    params = sum(p.numel() for p in model.parameters())
    print(f"{params / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}, {config.image_seq_length} image tokens",
          flush=True)
    for batch in loader:
        loss = loss_of(model, batch)
        optimizer_step(loss, model, optimizer, schedule)
        running.add({"loss": loss})
        step += 1
        run_steps += 1
        if step % 20 == 0:
            print(f"step {step} {running.report()} lr {schedule.get_last_lr()[0]:.2e} "
                  f"{(time.time() - begin) / run_steps:.2f}s/step", flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            vloss = validation_loss(model, valid_batches)
            if vloss < best["loss"]:
                best = {"loss": vloss, "step": step, "state": {k: v.clone() for k, v in model.state_dict().items()}}
            print(f"step {step} validation {vloss:.4f} (best {best['loss']:.4f} at {best['step']})", flush=True)
            save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "schedule": schedule.state_dict(), "step": step, "best": best}, ckpt_path)
        if step == args.steps or (args.stop_after is not None and run_steps >= args.stop_after):
            break
    if step == args.steps:
        model.load_state_dict(best["state"])
        save_bundle(model, tokenizer, processor, args.out, {"step": best["step"], "validation_loss": best["loss"],
                                                            "steps": args.steps, "batch_size": args.batch_size})
        print(f"saved the step-{best['step']} weights to {args.out}", flush=True)


def save_bundle(model, tokenizer, processor, out: str, training: dict) -> None:
    """The folder DocParsePipeline.from_pretrained loads: model (fp16 safetensors), tokenizer, processor."""
    os.makedirs(out, exist_ok=True)
    model.to(torch.float16).save_pretrained(out)
    model.to(torch.float32)
    tokenizer.save_pretrained(out)
    with open(os.path.join(out, "page_processor.json"), "w") as f:
        json.dump({**processor.to_dict(), "training": training}, f, indent=2)


if __name__ == "__main__":
    main()
