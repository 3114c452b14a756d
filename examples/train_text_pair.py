"""Train the bundled byte-level text pair (target + draft) used by the `ar` and `speculative` plugins.

The target is a 4-layer Llama; the draft is a 1-layer Llama distilled from the
target (soft targets), which raises its acceptance rate under speculative
decoding. Training is deterministic for a given seed and resumable: a
checkpoint is written to --work-dir every --ckpt-every steps.

Shipped weights were made with:
    python examples/train_text_pair.py --target-steps 800 --draft-steps 800
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from mmspec.text import pipeline as textlm
from mmspec.common.training import warmup_cosine_lr

TARGET_CONFIG = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=4)
DRAFT_CONFIG = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=2)


def make_config(arch: dict, seq_len: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=textlm.VOCAB_SIZE, bos_token_id=textlm.BOS_ID, eos_token_id=textlm.EOS_ID,
                       pad_token_id=textlm.EOS_ID, max_position_embeddings=max(1024, seq_len),
                       tie_word_embeddings=True, attn_implementation="sdpa", **arch)


def token_stream(texts: list[str]) -> torch.Tensor:
    ids = []
    for t in texts:
        ids += textlm.encode(t) + [textlm.EOS_ID]
    return torch.tensor(ids, dtype=torch.long)


def batches(stream: torch.Tensor, batch: int, seq_len: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
        yield torch.stack([stream[s:s + seq_len] for s in starts.tolist()])


@torch.no_grad()
def heldout_nll(model, stream: torch.Tensor, seq_len: int, n: int = 16) -> float:
    model.eval()
    x = torch.stack([stream[i * seq_len:(i + 1) * seq_len] for i in range(n)])
    loss = model(input_ids=x, labels=x).loss.item()
    model.train()
    return loss


def train(name: str, model, steps: int, args, stream, held, teacher=None):
    ckpt_path = Path(args.work_dir) / f"{name}.ckpt"
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    start = 0
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
        print(f"[{name}] resumed at step {start}")
    data = batches(stream, args.batch_size, args.seq_len, args.seed + (0 if teacher is None else 1))
    for _ in range(start):  # replay the data order so a resumed run matches an uninterrupted one
        next(data)
    model.train()
    t0 = time.time()
    for step in range(start, steps):
        for group in opt.param_groups:
            group["lr"] = warmup_cosine_lr(step, steps, args.lr, warmup=100)
        x = next(data)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits[:, :-1].float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
            if teacher is not None:
                with torch.no_grad():
                    soft = teacher(input_ids=x).logits[:, :-1].float().softmax(-1)
                kd = -(soft * logits.log_softmax(-1)).sum(-1).mean()
                loss = 0.5 * loss + 0.5 * kd
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 100 == 0:
            print(f"[{name}] step {step + 1}/{steps} loss {loss.item():.3f} "
                  f"heldout {heldout_nll(model, held, args.seq_len):.3f} {time.time() - t0:.0f}s", flush=True)
        if (step + 1) % args.ckpt_every == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, ckpt_path)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target-steps", type=int, default=800)
    parser.add_argument("--draft-steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ckpt-every", type=int, default=200)
    parser.add_argument("--work-dir", default="runs/text_pair")
    parser.add_argument("--out", default=str(textlm.BUNDLED_DIR))
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    split = textlm.split_corpus(textlm.stdlib_docstrings())
    stream, held = token_stream(split.train), token_stream(split.heldout)
    print(f"train tokens {len(stream)}, held-out tokens {len(held)}")

    target = LlamaForCausalLM(make_config(TARGET_CONFIG, args.seq_len))
    target = train("target", target, args.target_steps, args, stream, held)
    target.eval().requires_grad_(False)
    torch.manual_seed(args.seed + 1)
    draft = LlamaForCausalLM(make_config(DRAFT_CONFIG, args.seq_len))
    draft = train("draft", draft, args.draft_steps, args, stream, held, teacher=target)

    for name, model in (("target", target), ("draft", draft)):
        out = Path(args.out) / name
        model.to(torch.float16).save_pretrained(out)
        model.float()
        print(f"saved {name} to {out}: held-out NLL {heldout_nll(model, held, args.seq_len):.3f} nats/byte")


if __name__ == "__main__":
    main()
