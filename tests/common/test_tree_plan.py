"""Hardware-aware tree planning (`mmspec.common.tree_plan`) and the node-path tree syntax it prints."""

import itertools
import subprocess
import sys

import pytest
import torch

from mmspec.common.decoder import SpeculativeDecoder
from mmspec.common.draft import DraftModelDrafter
from mmspec.common.logits import LogitsPipeline
from mmspec.common.model import HFCausalLM
from mmspec.common.stats import DecodeStats
from mmspec.common.tree import TreeSpec, format_paths, parse_branching
from mmspec.common.tree_plan import (Candidate, TreePlan, best_trees, calibration_tree, chain_expectations,
                                     format_plan, plan_tree, rank_acceptance)


def test_node_paths_round_trip():
    tree = parse_branching("0;1;0.0;0.1;1.0;0.0.0")
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert parse_branching(format_paths(tree)).paths == tree.paths
    full = TreeSpec.full([3, 2, 1])
    assert parse_branching(format_paths(full)).paths == full.paths
    one = parse_branching(format_paths(TreeSpec.chain(1)))
    assert one.paths == ((0,),) and format_paths(one) == "0;"
    assert parse_branching("2,1").paths == TreeSpec.full([2, 1]).paths  # children per depth still read as before


@pytest.mark.parametrize("text, match", [("0;a", "dot-separated child ranks"), ("0;1.0", "no parent"),
                                         ("0;-1", ">= 0"), ("0;0", "duplicate"), ("0;2", "earlier sibling")])
def test_bad_node_paths_name_the_field(text, match):
    with pytest.raises(ValueError, match=match) as info:
        parse_branching(text, "EagleConfig.tree_branching")
    assert str(info.value).startswith("EagleConfig.tree_branching")


def test_level_index_feeds_only_nodes_with_children():
    tree = parse_branching("0;1;2;0.0;0.1;1.0;0.0.0")
    one = tree.level_index(1, "cpu")
    assert one.nodes.tolist() == [1, 2, 3] and one.ranks.tolist() == [0, 1, 2]
    assert one.expanding.tolist() == [1, 2] and one.expanding_parents.tolist() == [0, 0]  # node 3 is a leaf
    two = tree.level_index(2, "cpu")
    assert two.parents.tolist() == [1, 1, 2] and two.expanding.tolist() == [4]


def test_rank_acceptance_counts_offers_from_parents():
    tree = calibration_tree(depth=2, width=2)  # nodes: 1 (0), 2 (1), 3 (0.0), 4 (0.1)
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1))
    table = rank_acceptance(tree, [100, 60, 20, 30, 5])
    assert table.kept == [[60, 20], [30, 5]]
    assert table.offered == [[100, 100], [60, 60]]  # node 1 held 60 times: its children were on offer 60 times
    assert table.rates == [[0.6, 0.2], [0.5, 5 / 60]]
    with pytest.raises(ValueError, match="were they recorded with this tree"):
        rank_acceptance(tree, [100, 60, 20])


def expected_tokens(paths, rates):
    """1 + Σ over nodes of the product of rates along the node's path (what best_trees maximises)."""
    total = 1.0
    for p in paths:
        score = 1.0
        for d, r in enumerate(p):
            score *= rates[d][r] if d < len(rates) and r < len(rates[d]) else 0.0
        total += score
    return total


def all_trees(max_nodes, depth, width):
    """Every valid tree (parents and earlier siblings present) of up to max_nodes nodes within depth × width."""
    nodes = [p for d in range(1, depth + 1) for p in itertools.product(range(width), repeat=d)]
    for n in range(1, max_nodes + 1):
        for chosen in itertools.combinations(nodes, n):
            s = set(chosen)
            if all((len(p) == 1 or p[:-1] in s) and (p[-1] == 0 or p[:-1] + (p[-1] - 1,) in s) for p in chosen):
                yield chosen


def test_best_trees_are_the_best_of_every_size():
    """Checked against every tree up to 6 nodes (depth 3, 3 ranks), under rates non-increasing in rank."""
    rates = [[0.6, 0.25, 0.1], [0.5, 0.2, 0.05], [0.45, 0.3, 0.0]]
    best = {}
    for paths in all_trees(6, 3, 3):
        best[len(paths)] = max(best.get(len(paths), 0.0), expected_tokens(paths, rates))
    planned = best_trees(rates, 6)
    assert [t.num_nodes for t, _ in planned] == [1, 2, 3, 4, 5, 6]
    for tree, expected in planned:
        assert expected == pytest.approx(expected_tokens(tree.paths, rates))
        assert expected == pytest.approx(best[tree.num_nodes])
    for (small, _), (large, _) in zip(planned, planned[1:]):  # each grows the last by one node
        assert set(small.paths) < set(large.paths)


def test_best_trees_hand_computed():
    rates = [[0.6, 0.2, 0.1], [0.5, 0.1], [0.4]]
    got = [(format_paths(t), round(e, 3)) for t, e in best_trees(rates, 5)]
    assert got == [("0;", 1.6), ("0;0.0", 1.9), ("0;1;0.0", 2.1), ("0;1;0.0;0.0.0", 2.22),
                   ("0;1;0.0;1.0;0.0.0", 2.32)]


def test_siblings_never_kept_give_chains_and_rates_are_made_monotone():
    chain = best_trees([[0.7, 0.0], [0.6, 0.0], [0.5, 0.0]], 10)
    assert [format_paths(t) for t, _ in chain] == ["0;", "0;0.0", "0;0.0;0.0.0"]  # stops: nothing adds more
    assert chain[-1][1] == pytest.approx(1 + 0.7 + 0.42 + 0.21)
    # A later rank measured above an earlier one is clipped to it, so the tree stays valid.
    trees = best_trees([[0.2, 0.5]], 2)
    assert [format_paths(t) for t, _ in trees] == ["0;", "0;1"] and trees[-1][1] == pytest.approx(1.4)
    with pytest.raises(ValueError, match="max_nodes"):
        best_trees([[0.5]], 0)


def test_chain_expectations():
    assert chain_expectations([0.6, 0.3, 0.1]) == pytest.approx([1.6, 1.9, 2.0])


def test_decode_stats_tally_tree_nodes_on_accepted_paths():
    stats = DecodeStats()
    stats.record_step(torch.tensor([2, 1]), 2, None, torch.tensor([[0, 1, 3], [0, -1, -1]]), 4)
    stats.record_step(torch.tensor([3]), 2, None, torch.tensor([[0, 2, 4]]), 4)
    stats.settle()  # tallied lazily, as every per-step figure
    assert stats.tree_node_accepts == [3, 1, 1, 1, 1]
    merged = stats.merge(stats)
    assert merged.tree_node_accepts == [6, 2, 2, 2, 2]


def test_decoder_records_each_static_tree_node(tiny_pair):
    """The decoder's tally: the root is on every row-step's path, and depth-1 nodes together on every
    row-step that kept a draft."""
    target, draft = tiny_pair
    ids = torch.randint(1, 64, (3, 5), generator=torch.Generator().manual_seed(11))
    tree = parse_branching("0;1;0.0;0.1;0.0.0")
    decoder = SpeculativeDecoder(HFCausalLM(target), DraftModelDrafter(HFCausalLM(draft), tree=tree),
                                 logits=LogitsPipeline(temperature=0), num_draft_tokens=0)
    stats = decoder.generate(ids, max_new_tokens=30).stats
    counts = stats.tree_node_accepts
    assert len(counts) == 6 and counts[0] == stats.row_steps
    assert counts[1] + counts[2] == sum(stats.accepted_hist[2:])
    assert counts[5] <= counts[3] <= counts[1]


def test_plan_for_a_text_pair_times_every_candidate():
    plan = plan_tree("speculative", num_samples=2, timing_samples=1, max_nodes=3, progress=lambda *_: None)
    labels = [c.label for c in plan.candidates]
    assert labels[:3] == ["tree 1 node", "tree 2 nodes", "tree 3 nodes"]
    assert "chain 1" in labels and "chain 6" in labels  # the plugin's own chains compete
    assert all(c.ms_per_step > 0 for c in plan.candidates)
    assert plan.best is max(plan.candidates, key=lambda c: c.tokens_per_s)
    assert len(plan.calibration["rates"]) == 6 and plan.calibration["row_steps"] > 0
    for c in plan.candidates:  # every candidate's settings build the plugin
        assert parse_branching(c.settings["tree_branching"]) is None or c.label.startswith("tree")
    text = format_plan(plan)
    assert "(best)" in text and "--set tree_branching=" in text


def test_format_plan_compares_with_the_best_chain():
    plan = TreePlan("eagle", 1, {"rates": [[0.5]], "row_steps": 10}, [
        Candidate("chain 1", {"tree_branching": "", "num_draft_tokens": 1}, 1.5, 1, ms_per_step=10.0),
        Candidate("tree 2 nodes", {"tree_branching": "0;1"}, 1.8, 2, ms_per_step=10.0)])
    text = format_plan(plan)
    assert plan.best.label == "tree 2 nodes"
    assert "| tree 2 nodes (best) | 2 | 1.80 |" in text and "1.20×" in text
    assert "--set tree_branching='0;1'" in text


@pytest.mark.parametrize("kwargs, match", [({"plugin": "sjd"}, "drafts no static trees"),
                                           ({"settings": {"tree_branching": "2,1"}}, "plan-tree chooses"),
                                           ({"num_samples": 0}, "num_samples must be")])
def test_plan_errors_before_any_model_loads(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_tree(**{"plugin": "speculative", **kwargs})


def test_cli_refuses_bad_arguments_in_one_line():
    out = subprocess.run([sys.executable, "-m", "mmspec", "plan-tree", "eagle", "--max-nodes", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["mmspec plan-tree: error: --max-nodes must be >= 1, got 0"]
