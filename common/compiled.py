"""Compiled step forwards with static shapes (`compile=True`).

`torch.compile` specialises a graph to the shapes it saw; a decode loop whose batch shrinks as rows finish,
whose verify width changes with the draft and whose KV cache grows every step would recompile all the time,
and CUDA graphs need fixed shapes (and fixed addresses) outright. So a compiled adapter runs every forward at
a few bucketed shapes:

- a long fed length L (a prompt) is padded up to a multiple of 32 (`length_bucket`; decode steps feed a few
  lengths, run as they are); the padding is fed as dead tokens (token_mask False), which the slot table
  already knows how to carry;
- the batch is padded up to a power of two of rows that see only themselves;
- past keys live in a fixed-capacity buffer [rows, heads, C, dim] (`StaticKV`), C a multiple of
  `capacity_step`: the compiled graph reads all C slots (those past the live ones masked) and returns the new
  tokens' keys, which are written into the buffer outside the graph, so the graph mutates none of its inputs.

Shapes then come from a small set (batch bucket x length bucket x capacity), each compiled once. The adapter
side of the contract: an `ARModel` with `static_shapes` set (a `CompileSettings`) gets its tokens padded by
`ARModel.forward`, and its `_run` / `_map_kv` run against a `StaticKV`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Callable

import torch

COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Distinct (batch, length, capacity) buckets one compiled forward may see before dynamo gives up on it.
RECOMPILE_LIMIT = 64


# Fed lengths up to this run unpadded: a decode loop feeds few distinct lengths (1, a chain's K + 1, a tree's
# node count), each compiled once, and padding them costs real work (sjd's 17 tokens padded to 32 made its
# compiled verify slower than eager). Longer feeds (prompts) are rounded up to a multiple of it.
EXACT_LENGTHS = 32


def length_bucket(n: int) -> int:
    """The padded length of n fed tokens (n >= 1): n itself up to EXACT_LENGTHS, else the next multiple."""
    return n if n <= EXACT_LENGTHS else -(-n // EXACT_LENGTHS) * EXACT_LENGTHS


def row_bucket(n: int) -> int:
    """The padded batch of n rows (n >= 1): the next power of two (rows finish one by one; each power compiles
    once)."""
    return 1 << max(0, n - 1).bit_length()


def has_c_compiler() -> bool:
    """Whether inductor can build CPU kernels here (it needs a C++ compiler on the PATH)."""
    return any(shutil.which(name) for name in ("g++", "c++", "clang++"))


@dataclass(frozen=True)
class CompileSettings:
    """How an adapter compiles its step forward: `torch.compile(backend=..., mode=...)`.

    backend: "inductor" (fused kernels; on CPU it needs a C++ compiler) or any dynamo backend, e.g.
    "aot_eager" (graph capture without code generation: checks the static-shape path anywhere). mode:
    "reduce-overhead" records CUDA graphs on GPU. capacity_step: the KV buffer grows in this many slots."""

    backend: str = "inductor"
    mode: str | None = None
    capacity_step: int = 256

    def __post_init__(self) -> None:
        import torch._dynamo

        backends = set(torch._dynamo.list_backends(exclude_tags=())) | {"inductor"}
        if self.backend not in backends:
            raise ValueError(f"compile backend must be one of {sorted(backends)}, got {self.backend!r}")
        if self.mode not in COMPILE_MODES:
            raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {self.mode!r}")
        if isinstance(self.capacity_step, bool) or not isinstance(self.capacity_step, int) or self.capacity_step < 1:
            raise ValueError(f"capacity_step must be an int >= 1, got {self.capacity_step!r}")
        if self.backend == "inductor" and not torch.cuda.is_available() and not has_c_compiler():
            raise ValueError("compile backend 'inductor' needs a C++ compiler on the PATH for CPU kernels (none "
                             "found); install one or use backend='aot_eager'")

    def compile(self, fn: Callable) -> Callable:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, RECOMPILE_LIMIT)
        return torch.compile(fn, backend=self.backend, mode=self.mode, dynamic=False)


def as_compile_settings(compile) -> CompileSettings | None:
    """`compile=` as users give it: False/None (eager), True (inductor defaults), a backend name, a dict of
    CompileSettings fields, or a CompileSettings."""
    if compile is None or compile is False:
        return None
    if compile is True:
        return CompileSettings()
    if isinstance(compile, CompileSettings):
        return compile
    if isinstance(compile, str):
        return CompileSettings(backend=compile)
    if isinstance(compile, dict):
        return CompileSettings(**compile)
    raise ValueError(f"compile must be True, False, a backend name, a dict of CompileSettings fields or a "
                     f"CompileSettings, got {compile!r}")


class StaticKV:
    """Per-layer K and V buffers [row capacity, heads, slot capacity, dim] of one decode state.

    `rows` and `used` say how much is real: rows of the batch, and physical slots written (the slot table's
    count). Rows past `rows` and slots past `used` hold stale values that every mask hides."""

    def __init__(self, num_layers: int, heads: int, dim: int, dtype: torch.dtype, device,
                 settings: CompileSettings):
        self.settings = settings
        self.layout = (heads, dim, dtype, device)
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.rows = 0
        self.used = 0

    @property
    def row_capacity(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[0]

    @property
    def slot_capacity(self) -> int:
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def reserve(self, rows: int, slots: int) -> None:
        """Make room for `rows` rows and `slots` slots (buffers only grow, in buckets; the real part is kept)."""
        row_cap = max(self.row_capacity, row_bucket(max(rows, 1)))
        step = self.settings.capacity_step
        slot_cap = max(self.slot_capacity, -(-max(slots, 1) // step) * step)
        if row_cap == self.row_capacity and slot_cap == self.slot_capacity:
            return
        heads, dim, dtype, device = self.layout
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = torch.zeros(row_cap, heads, slot_cap, dim, dtype=dtype, device=device)
                if old is not None:
                    new[: self.rows, :, : self.used] = old[: self.rows, :, : self.used]
                store[i] = new

    def past(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(zip(self.keys, self.values))

    def write(self, new: list[tuple[torch.Tensor, torch.Tensor]], rows: int, start: int) -> None:
        """Store the new tokens' keys ([row capacity, heads, L, dim] per layer) at slots start..start+L."""
        length = new[0][0].shape[2]
        for i, (k, v) in enumerate(new):
            self.keys[i][:rows, :, start:start + length] = k[:rows]
            self.values[i][:rows, :, start:start + length] = v[:rows]
        self.rows, self.used = rows, start + length

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace the real part [rows, heads, used, dim] of every buffer by fn of it (select rows, drop or
        gather slots, join another state's rows), keeping the buffers' capacity where it suffices."""
        if self.keys[0] is None:
            return
        results = [(fn(k[: self.rows, :, : self.used]), fn(v[: self.rows, :, : self.used]))
                   for k, v in zip(self.keys, self.values)]
        rows, used = results[0][0].shape[0], results[0][0].shape[2]
        self.reserve(rows, used)
        for i, (k, v) in enumerate(results):
            self.keys[i][:rows, :, :used] = k
            self.values[i][:rows, :, :used] = v
        self.rows, self.used = rows, used


def static_inputs(tokens: torch.Tensor, positions: torch.Tensor, mask4d: torch.Tensor, cache: StaticKV,
                  num_slots: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens, positions and additive mask of a forward, laid out for the static buffers: rows padded to the
    buffer's row capacity (a padding row sees only its own tokens), and the mask's past columns spread over the
    full slot capacity (slots past `num_slots` hidden). mask4d: [B, 1, L, num_slots + L]."""
    batch, length = tokens.shape
    rows, capacity = cache.row_capacity, cache.slot_capacity
    hidden = torch.finfo(mask4d.dtype).min
    mask = mask4d.new_full((rows, 1, length, capacity + length), hidden)
    mask[:batch, :, :, :num_slots] = mask4d[..., :num_slots]
    mask[:batch, :, :, capacity:] = mask4d[..., num_slots:]
    index = torch.arange(length, device=mask.device)
    mask[batch:, :, index, capacity + index] = 0
    pad = rows - batch
    tokens = torch.nn.functional.pad(tokens, (0, 0, 0, pad))
    positions = torch.nn.functional.pad(positions, (0, 0, 0, pad))
    return tokens, positions, mask


def compiled_function(owner, settings: CompileSettings, build: Callable[[], Callable]) -> Callable:
    """The compiled form of `build()` for `owner` (e.g. a model) under `settings`, compiled once and kept on the
    owner, so every adapter a pipeline builds over the same model reuses one set of compiled graphs."""
    store = owner.__dict__.setdefault("_mmspec_compiled", {})
    key = (id(owner), settings)  # a deep copy of the owner carries the store over but must compile its own
    if key not in store:
        store[key] = settings.compile(build())
    return store[key]
