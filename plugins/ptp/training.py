"""Training pieces for `ptp` registers: the register-augmented batch, its mask, the loss, and draft accuracy.

A training row is one of the frozen model's own greedy sequences (prompt + answer: what it will be asked to
verify at inference), followed by register groups at m anchor positions. The group at anchor t holds
registers 1..k at positions t+1..t+k; register j's label is token t+1+j of the sequence. Its mask row sees
the sequence up to t and registers 1..j of its own group; sequence rows see only the sequence (causal), so
they compute exactly what the frozen model computes without registers.

Labels come from the model's own greedy output rather than the page's ground truth, because a draft is
accepted when it equals the model's argmax: on its own greedy sequence, register j is right exactly when its
argmax equals token t+1+j. That also makes `draft_accuracy` the expected number of drafts accepted per step
(consecutive correct registers from j = 1), the quantity the plugin's speed depends on.

Loss weights: w_j ∝ decay^(j-1), normalised to sum to 1. Draft j is only used when drafts 1..j-1 were
accepted, so its value to the decoder shrinks about as fast as the acceptance chance; a geometric decay (0.8
by default) spends the registers' capacity where acceptance happens, and keeps far registers trained. FastMTP
uses [0.51, 0.31, 0.18] for three steps, which decays faster (0.6); with more registers 0.8 loses less.
"""

from __future__ import annotations

import torch

from mmspec.common.slots import additive_mask


def loss_weights(k: int, decay: float = 0.8) -> torch.Tensor:
    w = decay ** torch.arange(k, dtype=torch.float32)
    return w / w.sum()


def register_batch(sequences: list[list[int]], prompt_lengths: list[int], k: int, anchors: int, vocab_size: int,
                   pad_id: int, generator: torch.Generator):
    """tokens, positions [B, L]; mask [B, L, L] bool; labels [B, L] (-100 where none); register j-1 index
    [B, L] (-1 on sequence tokens). Anchors are drawn from the answer positions t = P-1 .. T-3 (the last prompt
    token onward; register 1 needs token t+2), at most `anchors` per row, without replacement."""
    rows = []
    for seq, prompt_len in zip(sequences, prompt_lengths):
        length = len(seq)
        candidates = torch.arange(max(0, prompt_len - 1), max(0, length - 2))
        if candidates.numel() > anchors:
            candidates = candidates[torch.randperm(candidates.numel(), generator=generator)[:anchors]].sort().values
        tokens, positions, labels, index = list(seq), list(range(length)), [-100] * length, [-1] * length
        groups = []
        for t in candidates.tolist():
            start = len(tokens)
            for j in range(1, k + 1):
                tokens.append(vocab_size + j - 1)
                positions.append(t + j)
                labels.append(seq[t + 1 + j] if t + 1 + j < length else -100)
                index.append(j - 1)
            groups.append((t, start))
        rows.append((tokens, positions, labels, index, groups, length))
    width = max(len(r[0]) for r in rows)
    batch = len(rows)
    tokens = torch.full((batch, width), pad_id, dtype=torch.long)
    positions = torch.zeros(batch, width, dtype=torch.long)
    labels = torch.full((batch, width), -100, dtype=torch.long)
    index = torch.full((batch, width), -1, dtype=torch.long)
    mask = torch.zeros(batch, width, width, dtype=torch.bool)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    group_causal = torch.ones(k, k, dtype=torch.bool).tril()
    for b, (tok, pos, lab, idx, groups, length) in enumerate(rows):
        n = len(tok)
        tokens[b, :n], positions[b, :n] = torch.tensor(tok), torch.tensor(pos)
        labels[b, :n], index[b, :n] = torch.tensor(lab), torch.tensor(idx)
        mask[b, :length, :length] = causal[:length, :length]
        for t, start in groups:
            mask[b, start:start + k, : t + 1] = True
            mask[b, start:start + k, start:start + k] = group_causal
        pad = torch.arange(n, width)
        mask[b, pad, pad] = True  # padding queries see themselves only (a defined, discarded softmax)
    return tokens, positions, mask, labels, index


def register_logits(target, registers, tokens, positions, mask, inject_fn) -> torch.Tensor:
    """The target adapter's logits [B, L, V] on a register batch (one forward, fresh cache)."""
    state = target.new_state(tokens.shape[0])
    with inject_fn(registers, target.model, target.input_embedding_module(), target.vocab_size):
        out = target._run(state, tokens, positions, additive_mask(mask, target.mask_dtype()), False)
    return out.logits


def register_loss(logits, labels, index, weights) -> torch.Tensor:
    """Σ_j w_j · mean CE of register j over the batch's groups."""
    per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none")
    valid = labels >= 0
    loss = logits.new_zeros(())
    for j, w in enumerate(weights.tolist()):
        at = valid & (index == j)
        if bool(at.any()):
            loss = loss + w * per_token[at].mean()
    return loss


def draft_accuracy(logits, labels, index, k: int) -> dict:
    """Per register j: top-1 accuracy; and the mean run of correct registers from j = 1 per group (the
    expected drafts accepted per step under greedy verification, on these sequences)."""
    hit = (logits.argmax(-1) == labels) & (labels >= 0)
    per_j = [float(hit[(index == j) & (labels >= 0)].float().mean()) if bool(((index == j) & (labels >= 0)).any())
             else float("nan") for j in range(k)]
    runs = []
    for b in range(labels.shape[0]):
        starts = ((index[b] == 0)).nonzero().flatten().tolist()
        for s in starts:
            ok = hit[b, s:s + k]
            run = 0
            while run < k and bool(ok[run]):
                run += 1
            runs.append(run)
    return {"per_register": per_j, "mean_accepted": sum(runs) / max(1, len(runs))}
