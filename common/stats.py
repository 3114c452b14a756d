"""DecodeStats: what one generation cost and how well drafts were accepted."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch


@dataclass
class DecodeStats:
    num_rows: int = 0
    tokens: int = 0  # generated tokens, summed over rows
    target_nfe: int = 0  # target forwards in the decode loop (the prompt prefill is counted apart)
    target_width: int = 0  # tokens per row those forwards fed, summed over them (plain AR: one each)
    prefill_nfe: int = 0
    drafter_nfe: int = 0
    row_steps: int = 0  # sum over rows of the decode steps each row took part in
    accepted_hist: list[int] = field(default_factory=list)  # [k] = row-steps that committed k tokens
    drafted_per_position: list[int] = field(default_factory=list)  # row-steps that proposed draft i
    accepted_per_position: list[int] = field(default_factory=list)  # row-steps that accepted draft i
    # Static draft trees: [i] = row-steps whose accepted path held node i (node 0, the root: every row-step).
    # With the tree's shape this gives the acceptance of each (depth, sibling rank): see `tree_plan`.
    tree_node_accepts: list[int] = field(default_factory=list)
    time_draft_s: float = 0.0
    time_verify_s: float = 0.0
    time_accept_s: float = 0.0
    time_prefill_s: float = 0.0  # prompt prefills, including rows admitted into a running batch
    time_total_s: float = 0.0  # the whole decode call: prefill, draft, verify, accept and the loop's own work
    time_encode_s: float = 0.0  # the conditioning encoder a pipeline runs before decoding, if any
    # Per row of one decode call, in input order (set by decoders that track rows, when the call ends; empty
    # otherwise). `merge` concatenates them, so a merged run lists every row of every call in call order.
    row_forwards: list[int] = field(default_factory=list)  # decode steps row b took part in
    row_committed: list[int] = field(default_factory=list)  # tokens committed to row b (before EOS / length cuts)
    # A modality's own counters (summed by merge), e.g. seconds of input media or rows a gate finished
    # before the decode loop; the pipeline that records them documents their names.
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def nfe_per_sample(self) -> float:
        """Target forwards one sample needs (row_steps / rows): the step count a batch-1 run would take."""
        return self.row_steps / max(1, self.num_rows)

    @property
    def mean_accepted(self) -> float:
        """Tokens committed per row-step, bonus/correction token included (plain AR = 1.0)."""
        self.settle()
        total = sum(k * n for k, n in enumerate(self.accepted_hist))
        return total / max(1, sum(self.accepted_hist))

    @property
    def saves_nothing(self) -> bool:
        """Drafts were proposed but (almost) never accepted: under 2 % more tokens per target forward than plain
        AR, so the drafting was pure cost (`Plugin.advice_when_nothing_saved` says what to change)."""
        self.settle()
        return self.row_steps > 0 and sum(self.drafted_per_position) > 0 and self.mean_accepted < 1.02

    def forget_rows(self) -> None:
        """Drop the per-row lists: for a pipeline whose decode rows were not its samples (frames, regions)."""
        self.row_forwards, self.row_committed = [], []

    def count_target_forward(self, width: int) -> None:
        """One decode-loop target forward that fed `width` tokens per row."""
        self.target_nfe += 1
        self.target_width += width

    def add(self, name: str, value: float) -> None:
        """Add `value` to the modality counter `name` (see `extra`)."""
        self.extra[name] = self.extra.get(name, 0) + value

    @property
    def acceptance_per_position(self) -> list[float]:
        self.settle()
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def __post_init__(self) -> None:
        self._pending: list[tuple[torch.Tensor, int, torch.Tensor | None]] = []  # steps not yet tallied
        self._pending_paths: list[tuple[torch.Tensor, int]] = []  # accepted tree paths not yet tallied

    def record_step(self, committed: torch.Tensor, num_drafted: int, lengths: torch.Tensor | None = None,
                    path_nodes: torch.Tensor | None = None, num_tree_nodes: int = 0) -> None:
        """committed: [B] tokens committed per active row this step (accepted drafts + 1); lengths [B]: drafts
        each row really had (ragged chains), None = num_drafted for every row; path_nodes [B, P] (-1 padded):
        the accepted path of a static tree of num_tree_nodes draft nodes, root included.

        Tallied lazily (`settle`, and whenever a figure is read): reading the tensors each step would make the
        host wait for the device every step."""
        self.row_steps += committed.numel()
        self._pending.append((committed, num_drafted, lengths))
        if path_nodes is not None:
            self._pending_paths.append((path_nodes, num_tree_nodes + 1))

    def settle(self) -> None:
        """Tally the recorded steps into the histogram and per-position counts (one host read for all), and the
        accepted tree paths into `tree_node_accepts` (one more, when there are any)."""
        self._settle_paths()
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        width = max(n for _, n, _ in pending) + 2
        if len(self.accepted_hist) < width:
            self.accepted_hist += [0] * (width - len(self.accepted_hist))
        if len(self.drafted_per_position) < width - 2:
            grow = width - 2 - len(self.drafted_per_position)
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        device = pending[0][0].device
        position = torch.arange(width - 2, device=device)
        hist = torch.zeros(width, dtype=torch.long, device=device)
        drafted = torch.zeros(width - 2, dtype=torch.long, device=device)
        accepted = torch.zeros(width - 2, dtype=torch.long, device=device)
        for committed, num_drafted, lengths in pending:
            committed = committed.to(device)
            hist += torch.bincount(committed, minlength=width)[:width]
            has = (position[None] < (num_drafted if lengths is None else lengths.to(device)[:, None]))
            has = has.expand(committed.numel(), -1)
            drafted += has.sum(0)
            accepted += (committed[:, None] > position[None] + 1).sum(0)
        read = torch.cat([hist, drafted, accepted]).tolist()  # one read for the three tallies
        for name, counts in (("accepted_hist", read[:width]), ("drafted_per_position", read[width:2 * width - 2]),
                             ("accepted_per_position", read[2 * width - 2:])):
            totals = getattr(self, name)
            for i, n in enumerate(counts):
                totals[i] += n

    def _settle_paths(self) -> None:
        if not self._pending_paths:
            return
        pending, self._pending_paths = self._pending_paths, []
        width = max(n for _, n in pending)
        counts = torch.zeros(width + 1, dtype=torch.long, device=pending[0][0].device)
        for nodes, _ in pending:  # shifted by one so the -1 padding lands in bin 0 and is dropped
            counts += torch.bincount(nodes.flatten().to(counts.device) + 1, minlength=width + 1)[: width + 1]
        if len(self.tree_node_accepts) < width:
            self.tree_node_accepts += [0] * (width - len(self.tree_node_accepts))
        for i, n in enumerate(counts[1:].tolist()):
            self.tree_node_accepts[i] += n

    @contextmanager
    def timer(self, phase: str, device=None):
        """Accumulate wall time into time_{phase}_s (synchronising CUDA so the split is real)."""
        sync = device is not None and torch.device(device).type == "cuda"
        if sync:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if sync:
                torch.cuda.synchronize(device)
            name = f"time_{phase}_s"
            setattr(self, name, getattr(self, name) + time.perf_counter() - start)

    def to_dict(self) -> dict:
        self.settle()
        out = asdict(self)
        out.update(nfe_per_sample=self.nfe_per_sample, mean_accepted=self.mean_accepted,
                   acceptance_per_position=self.acceptance_per_position)
        return out

    def merge(self, other: "DecodeStats") -> "DecodeStats":
        self.settle()
        other.settle()
        merged = DecodeStats()
        for name, value in asdict(self).items():
            theirs = getattr(other, name)
            if name in ("row_forwards", "row_committed"):
                setattr(merged, name, value + theirs)
            elif isinstance(value, dict):
                setattr(merged, name, {k: value.get(k, 0) + theirs.get(k, 0) for k in {**value, **theirs}})
            elif isinstance(value, list):
                width = max(len(value), len(theirs))
                setattr(merged, name, [(value[i] if i < len(value) else 0) + (theirs[i] if i < len(theirs) else 0)
                                       for i in range(width)])
            else:
                setattr(merged, name, value + theirs)
        return merged

    def __str__(self) -> str:
        """One short line: long per-position lists are summarised (the full figures are in `to_dict`)."""
        acc = self.acceptance_per_position
        if len(acc) > 6:
            shown = ", ".join(f"{a:.2f}" for a in acc[:4]) + f", … {acc[-1]:.2f} ({len(acc)} positions)"
        else:
            shown = ", ".join(f"{a:.2f}" for a in acc)
        per_sample = f"{self.nfe_per_sample:.1f} target forwards/sample, " if self.row_steps else ""
        drafter = f", drafter forwards {self.drafter_nfe}" if self.drafter_nfe else ""
        extra = "".join(f", {k}={v:g}" for k, v in sorted(self.extra.items()))
        extra += "; drafts almost never accepted: no target forwards saved" if self.saves_nothing else ""
        return (f"DecodeStats({self.num_rows} rows, {self.tokens} tokens, {per_sample}"
                f"mean accepted {self.mean_accepted:.2f}, acceptance/position [{shown}]{drafter}, "
                f"time draft/verify/accept/total {self.time_draft_s:.2f}/{self.time_verify_s:.2f}/"
                f"{self.time_accept_s:.2f}/{self.time_total_s:.2f}s{extra})")


# --- noise of quality figures --------------------------------------------------------------------------
PER_SAMPLE = "per_sample"  # bench_quality's optional key: metric -> (numerators, denominators), one per sample


def split_quality(quality: dict) -> tuple[dict, dict]:
    """(the figures, their per-sample parts) of a `bench_quality` result."""
    quality = dict(quality)
    return quality, quality.pop(PER_SAMPLE, None) or {}


def paired_bootstrap(base: dict, accelerated: dict, *, resamples: int = 2000, seed: int = 0,
                     level: float = 0.95) -> dict:
    """The plugin's quality cost with its noise: for every metric both sides give per sample as
    (numerators, denominators) (metric = Σ num / Σ den: an accuracy, a mean NLL per token, a corpus WER),
    the difference plugin − AR and a percentile bootstrap interval of it. The two sides ran on the same inputs
    and seeds, so samples are resampled in pairs (what stays fixed between the sides cancels).

    Returns {metric: {"delta", "low", "high", "n"}}; metrics on one side only are left out.
    """
    import numpy as np

    out = {}
    rng = np.random.default_rng(seed)
    for metric in sorted(set(base) & set(accelerated)):
        (bn, bd), (an, ad) = (np.asarray(p, dtype=np.float64) for p in base[metric]), \
                             (np.asarray(p, dtype=np.float64) for p in accelerated[metric])
        n = len(bn)
        if not (len(bd) == len(an) == len(ad) == n) or n < 2:
            continue
        picks = rng.integers(0, n, size=(resamples, n))

        def ratio(num, den, rows):
            return num[rows].sum(-1) / np.maximum(den[rows].sum(-1), 1e-12)

        deltas = ratio(an, ad, picks) - ratio(bn, bd, picks)
        tail = (1 - level) / 2
        out[metric] = {"delta": float(an.sum() / max(ad.sum(), 1e-12) - bn.sum() / max(bd.sum(), 1e-12)),
                       "low": float(np.quantile(deltas, tail)), "high": float(np.quantile(deltas, 1 - tail)),
                       "n": n}
    return out

