"""Training examples for the page VLM: one rendered page, one of the three prompts, the target after it."""

from __future__ import annotations

import random

import torch

from .model import TASKS, PagePrompts
from .pages import page_markdown, render_page

TASK_WEIGHTS = (0.4, 0.2, 0.4)  # page, layout, region: regions are short, so they get as many draws as pages


def training_example(seed: int, prompts: PagePrompts, split: str = "train", max_length: int = 448) -> dict:
    """Page `seed` under one task drawn from (seed): {"image", "input_ids", "labels"} with the prompt masked
    (-100) in labels; a target longer than `max_length` is cut and keeps no end token (the model then never
    learns to stop early on a cut)."""
    rng = random.Random(f"task:{split}:{seed}")
    page = render_page(seed, split)
    task = rng.choices(TASKS, TASK_WEIGHTS)[0]
    if task == "page":
        prompt, target = prompts.prompt("page"), prompts.text_ids(page_markdown(page.blocks))
    elif task == "layout":
        prompt, target = prompts.prompt("layout"), prompts.layout_ids(page.blocks)
    else:
        block = rng.choice(page.blocks)
        prompt, target = prompts.prompt("region", block.box), prompts.text_ids(block.content)
    target = target + [prompts.eos_token_id]
    room = max_length - len(prompt)
    target = target[:room]
    return {"image": page.image, "input_ids": prompt + target, "labels": [-100] * len(prompt) + target,
            "task": task}


def collate(examples: list[dict], processor, pad_token_id: int) -> dict:
    """Right-padded ids / labels / attention mask and pixel values for a batch of `training_example`s."""
    longest = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), longest), pad_token_id)
    labels = torch.full((len(examples), longest), -100)
    mask = torch.zeros((len(examples), longest), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[row, :n] = torch.tensor(e["input_ids"])
        labels[row, :n] = torch.tensor(e["labels"])
        mask[row, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask,
            "pixel_values": processor([e["image"] for e in examples])}
