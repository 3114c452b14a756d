"""Transformer building blocks shared by models and drafter heads.

A pre-norm decoder layer (RMSNorm, rotary attention with grouped KV heads and
a per-layer [k, v] cache list — or [past k, past v, None] for a fixed-capacity cache — SwiGLU feed-forward) whose module and parameter
names follow the Llama reference code (attention.wqkv/wo, feed_forward.w1/w2/w3,
attention_norm, ffn_norm), so checkpoints in that layout load by name. The
caller supplies the rotary tables (1-D, 2-D, ...) as cos/sin.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def apply_rope(x, cos, sin):
    """x [B, L, H, D] with pairs (x[2i], x[2i+1]) rotated; cos/sin [B, L, D//2]."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    out = torch.stack([pairs[..., 0] * c - pairs[..., 1] * s, pairs[..., 0] * s + pairs[..., 1] * c], -1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, dim: int, n_head: int, n_kv_head: int):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, dim // n_head
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_kv_head) * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin, mask, cache: list | None):
        batch, length, _ = x.shape
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, self.n_kv_head * self.head_dim,
                                      self.n_kv_head * self.head_dim], -1)
        q = apply_rope(q.view(batch, length, self.n_head, self.head_dim), cos, sin).transpose(1, 2)
        k = apply_rope(k.view(batch, length, self.n_kv_head, self.head_dim), cos, sin).transpose(1, 2)
        v = v.view(batch, length, self.n_kv_head, self.head_dim).transpose(1, 2)
        if cache is not None and len(cache) == 3:
            # A fixed-capacity cache [past k, past v, None] (`mmspec.common.compiled`): attend over the past
            # slots and the new tokens, and hand the new keys back in cache[2] for the caller to store, so a
            # compiled graph mutates none of its inputs.
            cache[2] = (k, v)
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        elif cache is not None:
            if cache[0] is not None:
                k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
            cache[0], cache[1] = k, v
        if self.n_kv_head != self.n_head:
            rep = self.n_head // self.n_kv_head
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.wo(out.transpose(1, 2).reshape(batch, length, -1))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_head, n_kv_head, ffn_hidden, eps):
        super().__init__()
        self.attention = Attention(dim, n_head, n_kv_head)
        self.feed_forward = FeedForward(dim, ffn_hidden)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.attention(self.attention_norm(x), cos, sin, mask, cache)
        return x + self.feed_forward(self.ffn_norm(x))
