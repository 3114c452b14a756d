"""Train `ptp` registers for a frozen page VLM (the bundled doc-tiny, or any DocParsePipeline folder).

    python examples/train_ptp.py --out plugins/ptp/bundled/doc_tiny_registers --overwrite-shipped   # runs/ptp
    python examples/train_ptp.py --model-dir my_got_ocr2 --adapter-under model.language_model.layers \\
        --out my_registers                           # a GOT-OCR2 checkpoint folder (page and region prompts)
    python examples/train_ptp.py --pages 8 --steps 3 --work-dir /tmp/ptp --out /tmp/regs   # smoke run

1. Data: `--pages` training pages (seeds from 70 000 000 on, past anything the page VLM trained on) are
   rendered; the frozen model answers every prompt it has (page, layout, and one region prompt per true
   block) greedily; the sequences (prompt + answer) and each page's image features are cached in the work dir.
2. Registers: `--num-registers` k register embeddings plus rank-`--rank` adapters on every linear layer under
   `--adapter-under`, gated to register positions. Nothing else trains; the model's outputs stay bit-identical.
3. Steps: batches of `--batch-size` sequences, `--anchors` register groups each (plugins/ptp/training.py
   explains the mask, labels and loss weights), AdamW with warm-up and cosine decay. Every
   `--checkpoint-every` steps a checkpoint is written atomically and the expected drafts accepted per step on
   held-out sequences (5 % of pages) is measured; the best registers ship. Resuming gives the same registers
   as an uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from mmspec.common.logits import LogitsPipeline
from mmspec.common.training import RunningLosses, check_output_folder, load_checkpoint, optimizer_step, save_checkpoint, warmup_cosine_lr
from mmspec.docs_parse.model import PageVLMAR, encode_pages
from mmspec.docs_parse.pages import render_page
from mmspec.docs_parse.pipeline import BUNDLED_DOC_DIR, DocParsePipeline
from mmspec.docs_parse.structure import PageRegions
from mmspec.plugins.ptp import BUNDLED_REGISTERS
from mmspec.plugins.ptp.registers import RegisterSet, adaptable_linears, inject
from mmspec.plugins.ptp.training import draft_accuracy, loss_weights, register_batch, register_logits, register_loss

FIRST_SEED = 70_000_000


def make_data(pipe: DocParsePipeline, num_pages: int, max_new_tokens: int, batch: int = 8) -> dict:
    """The frozen model's greedy sequences on rendered training pages, and the pages' image features."""
    sequences, prompt_lengths, row_pages, features = [], [], [], []
    greedy = LogitsPipeline(temperature=0.0)
    tasks = pipe.prompts.tasks
    for start in range(0, num_pages, batch):
        pages = [render_page(FIRST_SEED + s, "train") for s in range(start, min(num_pages, start + batch))]
        images = [p.image for p in pages]
        feats = encode_pages(pipe.model, pipe.processor(images).to(pipe.device))
        prompts, rows = [], []
        for i, page in enumerate(pages):
            scale = pipe.processor.size / page.image.size[0]
            prompts += [pipe.prompts.prompt(t) for t in ("page", "layout") if t in tasks]
            rows += [i] * sum(t in tasks for t in ("page", "layout"))
            for block in page.blocks:
                box = tuple(int(round(v * scale)) for v in block.box)
                prompts.append(pipe.prompts.prompt("region", box))
                rows.append(i)
        answers, _ = pipe.decode(feats, rows, prompts, PageRegions("region"), greedy, max_new_tokens, None)
        for prompt, answer, row in zip(prompts, answers, rows):
            sequences.append(prompt + answer)
            prompt_lengths.append(len(prompt))
            row_pages.append(len(features) + row)
        features += list(feats.to(torch.float16))
        print(f"data: {start + len(pages)} / {num_pages} pages, {len(sequences)} sequences", flush=True)
    return {"sequences": sequences, "prompt_lengths": prompt_lengths, "row_pages": row_pages,
            "features": torch.stack(features)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=str(BUNDLED_DOC_DIR))
    parser.add_argument("--work-dir", default="runs/ptp")
    parser.add_argument("--out", required=True, help=f"where the registers go (the shipped ones: {BUNDLED_REGISTERS})")
    parser.add_argument("--overwrite-shipped", action="store_true", help="replace the shipped registers")
    parser.add_argument("--pages", type=int, default=480)
    parser.add_argument("--max-new-tokens", type=int, default=640)
    parser.add_argument("--num-registers", type=int, default=16)
    parser.add_argument("--anchors", type=int, default=12, help="register groups per sequence per step")
    parser.add_argument("--rank", type=int, default=16, help="adapter rank (0: register embeddings only)")
    parser.add_argument("--adapter-under", default="model.language_model.layers")
    parser.add_argument("--decay", type=float, default=0.8, help="loss weight decay over registers")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--stop-after", type=int, default=None, help="stop after this many steps of this run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    try:
        check_output_folder(args.out, overwrite=True, overwrite_shipped=args.overwrite_shipped,
                            parent_must_exist=False)
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(args.threads)
    os.makedirs(args.work_dir, exist_ok=True)

    pipe = DocParsePipeline.from_pretrained(args.model_dir)
    model = pipe.model.eval().requires_grad_(False)
    data_path = os.path.join(args.work_dir, "data.pt")
    if not os.path.exists(data_path):
        save_checkpoint(make_data(pipe, args.pages, args.max_new_tokens), data_path)
    data = torch.load(data_path)
    held_out_pages = max(1, len(data["features"]) // 20)
    first_valid_page = len(data["features"]) - held_out_pages
    train_rows = [i for i, p in enumerate(data["row_pages"]) if p < first_valid_page]
    valid_rows = [i for i, p in enumerate(data["row_pages"]) if p >= first_valid_page]

    vocab = model.get_output_embeddings().weight.shape[0]
    linears = adaptable_linears(model, args.adapter_under) if args.rank else []
    torch.manual_seed(args.seed)
    registers = RegisterSet(num_registers=args.num_registers, hidden_size=model.get_input_embeddings().weight.shape[1],
                            vocab_size=vocab, adapter_modules=tuple(n for n, _ in linears),
                            adapter_shapes=tuple((m.in_features, m.out_features) for _, m in linears),
                            adapter_rank=args.rank, model_type=model.config.model_type)
    optimizer = torch.optim.AdamW(registers.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine_lr(s, args.steps, 1.0, warmup=min(50, args.steps // 10 + 1)))
    weights = loss_weights(args.num_registers, args.decay)
    features = data["features"].float()
    pad = pipe.prompts.eos_token_id

    def batch_of(rows, generator):
        pages = torch.tensor([data["row_pages"][r] for r in rows])
        target = PageVLMAR(model, features, pages, pipe.prompts.image_token_id)
        tensors = register_batch([data["sequences"][r] for r in rows], [data["prompt_lengths"][r] for r in rows],
                                 args.num_registers, args.anchors, vocab, pad, generator)
        return target, tensors

    def evaluate():
        runs, per_j, n = 0.0, torch.zeros(args.num_registers), 0
        g = torch.Generator().manual_seed(1234)
        with torch.no_grad():
            for start in range(0, len(valid_rows), args.batch_size):
                rows = valid_rows[start:start + args.batch_size]
                target, (tokens, positions, mask, labels, index) = batch_of(rows, g)
                logits = register_logits(target, registers, tokens, positions, mask, inject)
                acc = draft_accuracy(logits, labels, index, args.num_registers)
                runs += acc["mean_accepted"] * len(rows)
                per_j += torch.tensor(acc["per_register"]).nan_to_num(0.0) * len(rows)
                n += len(rows)
        return runs / n, (per_j / n).tolist()

    ckpt_path = os.path.join(args.work_dir, "checkpoint.pt")
    step, best = 0, {"accepted": -1.0, "step": -1, "state": None}
    saved = load_checkpoint(ckpt_path, registers, optimizer, schedule)
    if saved is not None:
        step, best = saved["step"], saved["best"]
        print(f"resumed at step {step}", flush=True)
    print(f"{len(train_rows)} training sequences, {len(valid_rows)} held out; "
          f"{sum(p.numel() for p in registers.parameters()) / 1e3:.1f}k register parameters", flush=True)
    running, begin, run_steps = RunningLosses(), time.time(), 0
    while step < args.steps:
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)  # batch of a step = f(step): resumable
        rows = [train_rows[i] for i in torch.randint(len(train_rows), (args.batch_size,), generator=g).tolist()]
        target, (tokens, positions, mask, labels, index) = batch_of(rows, g)
        logits = register_logits(target, registers, tokens, positions, mask, inject)
        loss = register_loss(logits, labels, index, weights)
        optimizer_step(loss, registers, optimizer, schedule)
        running.add({"loss": loss})
        step += 1
        run_steps += 1
        if step % 10 == 0:
            print(f"step {step} {running.report()} {(time.time() - begin) / run_steps:.2f}s/step", flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            accepted, per_j = evaluate()
            if accepted > best["accepted"]:
                best = {"accepted": accepted, "step": step, "per_register": per_j,
                        "state": {k: v.clone() for k, v in registers.state_dict().items()}}
            print(f"step {step} held-out drafts accepted/step {accepted:.3f} (best {best['accepted']:.3f} at "
                  f"{best['step']}); top-1 per register {[round(a, 2) for a in per_j]}", flush=True)
            save_checkpoint({"model": registers.state_dict(), "optimizer": optimizer.state_dict(),
                             "schedule": schedule.state_dict(), "step": step, "best": best}, ckpt_path)
        if args.stop_after is not None and run_steps >= args.stop_after:
            break
    if step == args.steps:
        registers.load_state_dict(best["state"])
        registers.save_pretrained(args.out)
        with open(os.path.join(args.out, "training.json"), "w") as f:
            json.dump({"step": best["step"], "steps": args.steps, "held_out_accepted_per_step": best["accepted"],
                       "top1_per_register": best["per_register"], "pages": args.pages,
                       "sequences": len(train_rows), "batch_size": args.batch_size, "anchors": args.anchors,
                       "rank": args.rank, "decay": args.decay, "lr": args.lr}, f, indent=2)
        print(f"saved the step-{best['step']} registers to {args.out}", flush=True)


if __name__ == "__main__":
    main()
