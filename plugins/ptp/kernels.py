"""The inputs of `ptp`'s verify pass, built in one launch: token ids, positions and the padding mask of every
node of the register tree for every row.

Per step and row, node n of the tree (`register_tree(k)`) gets:

- token: the newest token (root), draft d (chain node d), or register id `vocab_size + j - 1` (register j);
- position: the row's newest position + depth(n);
- needed: the node's chain anchor (the chain node it is, or hangs after) is within the row's draft length;
  drafts past a ragged row's length, and the register groups after them, are padding.

In torch that is about ten small ops per step (scatter the drafts, repeat the register ids, compare anchors
with lengths, add depths); on a GPU at small batch each is a kernel launch that costs more than its work, and
the verify forward waits for all of them. The Triton kernel does it in one launch, one program per row.
`verify_inputs_reference` defines the semantics; the kernel must reproduce them exactly (tested under
TRITON_INTERPRET=1).
"""

from __future__ import annotations

import torch

from mmspec.common.kernels import HAS_TRITON, kernel_backend
from mmspec.common.kernels.triton_utils import require_launchable

if HAS_TRITON:
    import triton
    import triton.language as tl

ROOT, CHAIN, REGISTER = 0, 1, 2


def node_table(tree) -> torch.Tensor:
    """[4, N+1] long per node: kind (ROOT / CHAIN / REGISTER), slot (draft index d-1, or register index j-1),
    anchor (the chain index the node is or hangs after), depth."""
    spec = tree.spec
    n = spec.num_nodes + 1
    kind = torch.full((n,), REGISTER, dtype=torch.long)
    slot = tree.register_index.clone()
    kind[0], slot[0] = ROOT, 0
    kind[tree.chain] = CHAIN
    slot[tree.chain] = torch.arange(len(tree.chain))
    anchor = torch.where(tree.group_of < 0, spec.depth, tree.group_of)
    return torch.stack([kind, slot, anchor, spec.depth.clone()])


def verify_inputs_reference(table, last_tokens, drafts, lengths, positions, vocab_size: int):
    """table [4, N+1]; last_tokens, lengths, positions [B]; drafts [B, k] -> tokens, positions [B, N+1] long,
    needed [B, N+1] bool."""
    kind, slot, anchor, depth = table
    batch = last_tokens.shape[0]
    draft_at = drafts.gather(1, torch.where(kind == CHAIN, slot, 0)[None].expand(batch, -1))
    tokens = torch.where(kind[None] == ROOT, last_tokens[:, None],
                         torch.where(kind[None] == CHAIN, draft_at, vocab_size + slot[None]))
    return tokens, positions[:, None] + depth[None], anchor[None] <= lengths[:, None]


if HAS_TRITON:

    @triton.jit(do_not_specialize=["N", "K", "vocab_size"])
    def _verify_inputs_kernel(table_ptr, last_ptr, drafts_ptr, lengths_ptr, positions_ptr, tokens_out, positions_out,
                              needed_out, N, K, vocab_size, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        block = tl.program_id(1)
        nodes = block * BLOCK + tl.arange(0, BLOCK)
        inside = nodes < N
        kind = tl.load(table_ptr + nodes, mask=inside, other=0)
        slot = tl.load(table_ptr + N + nodes, mask=inside, other=0)
        anchor = tl.load(table_ptr + 2 * N + nodes, mask=inside, other=0)
        depth = tl.load(table_ptr + 3 * N + nodes, mask=inside, other=0)
        last = tl.load(last_ptr + row)
        length = tl.load(lengths_ptr + row)
        position = tl.load(positions_ptr + row)
        is_chain = kind == 1
        draft = tl.load(drafts_ptr + row * K + slot, mask=inside & is_chain, other=0)
        token = tl.where(kind == 0, last, tl.where(is_chain, draft, vocab_size + slot))
        out = row * N + nodes
        tl.store(tokens_out + out, token, mask=inside)
        tl.store(positions_out + out, position + depth, mask=inside)
        tl.store(needed_out + out, (anchor <= length).to(tl.int8), mask=inside)


_BLOCK = 128


def verify_inputs(table: torch.Tensor, last_tokens: torch.Tensor, drafts: torch.Tensor, lengths: torch.Tensor,
                  positions: torch.Tensor, vocab_size: int):
    """The verify pass's tokens, positions and needed mask (see the module docstring)."""
    device = last_tokens.device
    args = [t.to(device=device, dtype=torch.long).contiguous() for t in (table, last_tokens, drafts, lengths, positions)]
    if kernel_backend(device) != "triton" or args[0].shape[1] == 0 or args[1].numel() == 0:
        return verify_inputs_reference(*args, vocab_size)
    require_launchable(_verify_inputs_kernel, device)
    batch, nodes = args[1].shape[0], args[0].shape[1]
    tokens = torch.empty(batch, nodes, dtype=torch.long, device=device)
    out_positions = torch.empty_like(tokens)
    needed = torch.empty(batch, nodes, dtype=torch.int8, device=device)
    grid = (batch, triton.cdiv(nodes, _BLOCK))
    _verify_inputs_kernel[grid](*args, tokens, out_positions, needed, nodes, args[2].shape[1], vocab_size,
                                BLOCK=_BLOCK)
    return tokens, out_positions, needed.bool()
