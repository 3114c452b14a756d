"""Hardware-aware static draft trees, after Sequoia (Chen et al. 2024, arXiv:2402.12374).

A tree's worth is how many tokens a step commits; its price is the step's time, which on a GPU hardly grows
with the number of nodes verified and on a CPU grows with every one (BENCHMARKS.md, "Where the time goes").
No one shape is best on both, so the shape is planned for the machine and model at hand:

1. Acceptance by position (`rank_acceptance`): from a calibration run with a wide tree, the rate c[d][r] at
   which the rank-r child of an accepted depth-(d-1) node is the one kept (`DecodeStats.tree_node_accepts`
   counts how often each node lay on the accepted path; a node was on offer whenever its parent was).
2. Best tree per size (`best_trees`): assuming, as Sequoia does, that c depends only on depth and rank, a
   tree commits 1 + Σ_nodes Π_{(d, r) on the node's path} c[d][r] tokens per step on average. With c made
   non-increasing in r, no node scores above its parent or an earlier-ranked sibling, so for each size n the
   n best-scoring nodes form a tree, and it is the best tree of n nodes (grown from a heap, best first).
3. Cost (`plan_tree`): every candidate (the best tree of each size, and the plugin's own chains) decodes the
   same inputs, batch by batch in a turning order; its milliseconds per decode step are measured, not
   modelled.
4. The plan is the candidate with the most predicted tokens per second; `plan_tree` returns the whole table.

The planned tree is an ordinary static tree (`tree_branching="0;1;0.0;..."`), so every guarantee of the
plugin's tree rule (greedy identical to AR, the sampling law) holds for it unchanged.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from .bench_run import interleaved_runs, split_settings
from .loading import default_pipeline
from .tree import TreeSpec, format_paths

CALIBRATION_DEPTH = 6
CALIBRATION_WIDTH = 4


def calibration_tree(depth: int = CALIBRATION_DEPTH, width: int = CALIBRATION_WIDTH) -> TreeSpec:
    """A spine of best children `depth` long, each spine node (the root included) offering `width` ranked
    children: depth × width nodes, every (depth, rank) up to those limits on offer whenever the spine holds."""
    if depth < 1 or width < 1:
        raise ValueError(f"calibration depth and width must be >= 1, got {depth} and {width}")
    return TreeSpec.from_paths([(0,) * d + (r,) for d in range(depth) for r in range(width)])


@dataclass
class RankAcceptance:
    """kept[d-1][r] of offered[d-1][r] times, the rank-r child of an accepted depth-(d-1) node was kept."""
    kept: list[list[int]]
    offered: list[list[int]]

    @property
    def rates(self) -> list[list[float]]:
        """c[d-1][r]; a (depth, rank) never on offer gets rate 0 (nothing to plan on)."""
        return [[k / o if o else 0.0 for k, o in zip(ks, os)] for ks, os in zip(self.kept, self.offered)]


def rank_acceptance(tree: TreeSpec, node_accepts: list[int]) -> RankAcceptance:
    """Acceptance per (depth, rank) from `tree_node_accepts` of runs with `tree`."""
    if len(node_accepts) != tree.num_nodes + 1:
        raise ValueError(f"node_accepts has {len(node_accepts)} counts; the tree has {tree.num_nodes + 1} nodes "
                         "(root included): were they recorded with this tree?")
    width = max(tree.ranks) + 1
    kept = [[0] * width for _ in range(tree.max_depth)]
    offered = [[0] * width for _ in range(tree.max_depth)]
    for node in range(1, tree.num_nodes + 1):
        d, r = len(tree.paths[node - 1]), tree.ranks[node]
        kept[d - 1][r] += node_accepts[node]
        offered[d - 1][r] += node_accepts[tree.parents[node]]
    return RankAcceptance(kept, offered)


def best_trees(rates: list[list[float]], max_nodes: int) -> list[tuple[TreeSpec, float]]:
    """For n = 1..max_nodes (fewer when every node left would add nothing): the n-node tree with the most
    expected tokens per step under `rates` (c[d-1][r]), and that expectation (bonus token included)."""
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    # Non-increasing in rank, so the best n nodes always include each one's earlier siblings.
    monotone = []
    for row in rates:
        clipped, low = [], 1.0
        for c in row:
            low = min(low, max(0.0, min(1.0, float(c))))
            clipped.append(low)
        monotone.append(clipped)

    def rate(path: tuple[int, ...]) -> float:
        d, r = len(path), path[-1]
        return monotone[d - 1][r] if d <= len(monotone) and r < len(monotone[d - 1]) else 0.0

    # Heap of (−score, path, score, parent's score); a node's score is the chance its whole path is kept.
    frontier = [(-rate((0,)), (0,), rate((0,)), 1.0)]
    chosen: list[tuple[int, ...]] = []
    expected, out = 1.0, []
    while frontier and len(chosen) < max_nodes:
        _, path, score, parent_score = heapq.heappop(frontier)
        if score <= 0.0:  # scores only fall from here: nothing left adds a token
            break
        chosen.append(path)
        expected += score
        out.append((TreeSpec.from_paths(chosen), expected))
        child, sibling = path + (0,), path[:-1] + (path[-1] + 1,)
        heapq.heappush(frontier, (-score * rate(child), child, score * rate(child), score))
        heapq.heappush(frontier, (-parent_score * rate(sibling), sibling, parent_score * rate(sibling), parent_score))
    return out


def chain_expectations(acceptance_per_position: list[float]) -> list[float]:
    """Expected tokens per step of chains of 1..K drafts, from a K-draft chain's per-position acceptance (the
    share of steps that kept draft i: P(the first i+1 all kept))."""
    out, total = [], 1.0
    for a in acceptance_per_position:
        total += a
        out.append(total)
    return out


@dataclass
class Candidate:
    label: str  # "tree 6 nodes", "chain 4"
    settings: dict  # the plugin config it runs with
    expected_tokens: float  # predicted tokens committed per row-step (bonus included)
    nodes: int
    ms_per_step: float = 0.0  # measured decode-loop milliseconds per target step
    measured_tokens: float = 0.0  # tokens per row-step in the timing run (few samples: noisier)

    @property
    def tokens_per_s(self) -> float:
        """Predicted tokens per second of one row (expected tokens over the measured step time)."""
        return 1000.0 * self.expected_tokens / self.ms_per_step if self.ms_per_step else 0.0


@dataclass
class TreePlan:
    plugin: str
    batch_size: int
    calibration: dict  # the calibration tree, its samples and the acceptance table
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def best(self) -> Candidate:
        return max(self.candidates, key=lambda c: c.tokens_per_s)

    def best_chain(self) -> Candidate | None:
        chains = [c for c in self.candidates if c.label.startswith("chain")]
        return max(chains, key=lambda c: c.tokens_per_s) if chains else None


def tree_plugins() -> list[str]:
    """The registered plugins whose config takes a static tree (`tree_branching`)."""
    from dataclasses import fields

    from .registry import get_plugin_class, plugin_summaries

    return [s.name for s in plugin_summaries()
            if "tree_branching" in {f.name for f in fields(get_plugin_class(s.name).Config)}]


def candidate_sizes(max_nodes: int) -> list[int]:
    """Tree sizes worth timing: every size up to 8, then every other up to 16, then every fourth."""
    return [n for n in range(1, max_nodes + 1) if n <= 8 or (n <= 16 and n % 2 == 0) or n % 4 == 0]


def plan_tree(plugin: str, model: str | None = None, num_samples: int = 16, timing_samples: int = 4,
              batch_size: int = 1, max_nodes: int = 24, seed: int = 0, device: str = "cpu",
              settings: dict | None = None, calibration_depth: int = CALIBRATION_DEPTH,
              calibration_width: int = CALIBRATION_WIDTH, progress=print) -> TreePlan:
    """Plan `plugin`'s static tree for this machine (module docstring): calibrate acceptance on `num_samples`
    inputs, time every candidate on `timing_samples` inputs at `batch_size`."""
    from dataclasses import fields

    from .registry import get_plugin_class

    for name, value, low in (("num_samples", num_samples, 1), ("timing_samples", timing_samples, 1),
                             ("batch_size", batch_size, 1), ("max_nodes", max_nodes, 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    plugin_cls = get_plugin_class(plugin)
    config_fields = {f.name for f in fields(plugin_cls.Config)}
    if "tree_branching" not in config_fields:
        raise ValueError(f"plugin {plugin!r} drafts no static trees (its config has no tree_branching); plugins "
                         f"that do: {', '.join(tree_plugins())}")
    settings = dict(settings or {})
    for key in ("tree_branching", "tree_depth"):
        if settings.get(key):
            raise ValueError(f"--set {key} is what plan-tree chooses; leave it out")
    calib = calibration_tree(calibration_depth, calibration_width)
    pipeline = default_pipeline(plugin_cls, model=model, device=device)
    call, config = split_settings(pipeline, plugin_cls, settings, bench=True)
    inputs = pipeline.bench_inputs(max(num_samples, timing_samples), seed,
                                   **{k: call[k] for k in pipeline.bench_input_settings})

    def attach(extra: dict):
        return plugin_cls(**{**config, **extra}).attach(pipeline)

    progress(f"[plan-tree] {plugin}: calibrating on {num_samples} samples with a {calib.num_nodes}-node tree "
             f"(depth {calibration_depth}, {calibration_width} children per spine node)")
    calib_pipe = attach({"tree_branching": format_paths(calib)})
    calib_pipe.bench_generate(inputs[:1], 1, seed, call)  # warm-up
    [(_, stats, _)] = interleaved_runs((calib_pipe,), inputs[:num_samples], batch_size, seed, call)
    table = rank_acceptance(calib, stats.tree_node_accepts)
    sizes = set(candidate_sizes(max_nodes))
    trees = [t for t in best_trees(table.rates, max_nodes) if t[0].num_nodes in sizes]
    candidates = [Candidate(f"tree {t.num_nodes} node{'s' * (t.num_nodes > 1)}", {"tree_branching": format_paths(t)},
                          e, t.num_nodes) for t, e in trees]

    chain_acceptance = None
    if "num_draft_tokens" in config_fields:
        try:
            chain_pipe = attach({"tree_branching": "", "num_draft_tokens": calibration_depth})
        except ValueError:  # the plugin drafts trees only: its chains are the spine trees above
            chain_pipe = None
        if chain_pipe is not None:
            if call.get("temperature", 1.0) == 0 or getattr(plugin_cls, "sampled_tree_children", False):
                # A chain drafts as the tree's spine does (the argmax, or a token sampled from the drafter), so
                # the calibration run's spine predicts it, from the same inputs.
                spine = 1.0
                chain_acceptance = []
                for row in table.rates:
                    spine *= row[0]
                    chain_acceptance.append(spine)
            else:  # tree children are top-ranked tokens while chains sample theirs: a chain run of its own
                progress(f"[plan-tree] {plugin}: chain acceptance on {num_samples} samples "
                         f"({calibration_depth} drafts)")
                [(_, chain_stats, _)] = interleaved_runs((chain_pipe,), inputs[:num_samples], batch_size, seed, call)
                chain_acceptance = chain_stats.acceptance_per_position
            for k, e in enumerate(chain_expectations(chain_acceptance), 1):
                candidates.append(Candidate(f"chain {k}", {"tree_branching": "", "num_draft_tokens": k}, e, k))

    pipes = [attach(c.settings) for c in candidates]
    progress(f"[plan-tree] {plugin}: timing {len(candidates)} candidates on {timing_samples} samples, "
             f"batch {batch_size}, alternating")
    for pipe in pipes:
        pipe.bench_generate(inputs[:1], 1, seed, call)  # warm-up
    runs = interleaved_runs(pipes, inputs[:timing_samples], batch_size, seed, call, rotate=True)
    for cand, (_, run_stats, _) in zip(candidates, runs):
        loop_s = run_stats.time_total_s - run_stats.time_prefill_s
        cand.ms_per_step = 1000.0 * loop_s / max(1, run_stats.target_nfe)
        cand.measured_tokens = run_stats.mean_accepted
    calibration = {"tree": format_paths(calib), "num_samples": num_samples, "row_steps": stats.row_steps,
                   "rates": table.rates, "kept": table.kept, "offered": table.offered,
                   "chain_acceptance": chain_acceptance, "settings": {**call, **config}}
    return TreePlan(plugin, batch_size, calibration, candidates)


def format_plan(plan: TreePlan) -> str:
    """The candidates as a markdown table, best first, and the line to use the plan."""
    best, chain = plan.best, plan.best_chain()
    lines = ["| candidate | nodes | predicted tokens/step | measured tokens/step | ms/step | predicted tokens/s "
             "| vs best chain |", "|---|---|---|---|---|---|---|"]
    for c in sorted(plan.candidates, key=lambda c: -c.tokens_per_s):
        ratio = f"{c.tokens_per_s / chain.tokens_per_s:.2f}×" if chain and chain.tokens_per_s else "—"
        lines.append(f"| {c.label}{' (best)' if c is best else ''} | {c.nodes} | {c.expected_tokens:.2f} | "
                     f"{c.measured_tokens:.2f} | {c.ms_per_step:.1f} | {c.tokens_per_s:.0f} | {ratio} |")
    rates = plan.calibration["rates"]
    lines += ["", "Acceptance by depth (rows) and sibling rank (columns), calibration "
              f"({plan.calibration['row_steps']} row-steps):"]
    lines += ["  depth " + str(d + 1) + ": " + "  ".join(f"{c:.3f}" for c in row) for d, row in enumerate(rates)]
    setting = " ".join(f"--set {k}={v!r}" if isinstance(v, str) else f"--set {k}={v}"
                       for k, v in best.settings.items())
    lines += ["", f"Best on this machine at batch {plan.batch_size}: {best.label} — use {setting}"]
    return "\n".join(lines)
