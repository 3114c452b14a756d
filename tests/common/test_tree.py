"""Static draft trees: node order, parents, depths, ancestor masks, leaf paths, and path validation."""

import pytest
import torch

from mmspec.common.tree import TreeSpec


def test_full_2_2_layout():
    tree = TreeSpec.full([2, 2])
    assert tree.num_nodes == 6
    assert tree.max_depth == 2
    # Nodes 1..6 ordered by depth, then by path.
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1))
    assert tree.parent.tolist() == [-1, 0, 0, 1, 1, 2, 2]
    assert tree.depth.tolist() == [0, 1, 1, 2, 2, 2, 2]
    assert tree.rank.tolist() == [-1, 0, 1, 0, 1, 0, 1]
    assert tree.children(0) == [1, 2]
    assert tree.children(1) == [3, 4]
    assert tree.children(2) == [5, 6]
    assert tree.children(3) == []
    assert tree.nodes_at_depth(0) == [0]
    assert tree.nodes_at_depth(1) == [1, 2]
    assert tree.nodes_at_depth(2) == [3, 4, 5, 6]


def test_full_2_2_ancestor_mask():
    tree = TreeSpec.full([2, 2])
    expected_rows = {
        0: {0},
        1: {0, 1},
        2: {0, 2},
        3: {0, 1, 3},
        4: {0, 1, 4},
        5: {0, 2, 5},
        6: {0, 2, 6},
    }
    anc = tree.ancestor_mask
    assert anc.shape == (7, 7) and anc.dtype == torch.bool
    for i, ancestors in expected_rows.items():
        assert set(anc[i].nonzero().flatten().tolist()) == ancestors, f"row {i}"
    # Every node sees itself and the root; no node sees a later-numbered node.
    assert anc.diagonal().all()
    assert anc[:, 0].all()
    assert not torch.triu(anc, diagonal=1).any()


def test_full_2_2_retrieve_paths():
    tree = TreeSpec.full([2, 2])
    assert tree.retrieve_paths.tolist() == [[0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 2, 6]]


def test_uneven_tree_retrieve_paths_are_padded():
    # Node (1,) is a leaf at depth 1; (0,) has one child (0, 0).
    tree = TreeSpec.from_paths([(0,), (1,), (0, 0)])
    assert tree.parent.tolist() == [-1, 0, 0, 1]
    assert tree.retrieve_paths.tolist() == [[0, 2, -1], [0, 1, 3]]


def test_from_paths_sorts_input_order():
    a = TreeSpec.from_paths([(1, 0), (0,), (1,), (0, 0)])
    b = TreeSpec.from_paths([(0,), (1,), (0, 0), (1, 0)])
    assert a.paths == b.paths
    assert torch.equal(a.parent, b.parent)
    assert torch.equal(a.ancestor_mask, b.ancestor_mask)


def test_chain():
    tree = TreeSpec.chain(3)
    assert tree.num_nodes == 3
    assert tree.paths == ((0,), (0, 0), (0, 0, 0))
    assert tree.parent.tolist() == [-1, 0, 1, 2]
    assert tree.depth.tolist() == [0, 1, 2, 3]
    assert tree.retrieve_paths.tolist() == [[0, 1, 2, 3]]
    assert torch.equal(tree.ancestor_mask, torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("paths, match", [
    ([(0, 0)], "no parent"),
    ([(0,), (0, 1), (1, 0)], "no parent"),
    ([(0,), (0,)], "duplicate"),
    ([(0,), (-1,)], ">= 0"),
    ([(0,), (0, -2)], ">= 0"),
    ([], "at least one"),
    ([()], "non-empty"),
])
def test_invalid_paths(paths, match):
    with pytest.raises(ValueError, match=match):
        TreeSpec.from_paths(paths)


@pytest.mark.parametrize("branching", [[], [0], [2, 0], [-1]])
def test_invalid_full(branching):
    with pytest.raises(ValueError, match="branching"):
        TreeSpec.full(branching)


@pytest.mark.parametrize("length", [0, -3])
def test_invalid_chain(length):
    with pytest.raises(ValueError, match="length"):
        TreeSpec.chain(length)


# --- dynamic trees (EAGLE-2) ---------------------------------------------------------------------------

def _logp(batch_rows: list[dict], vocab: int = 6) -> torch.Tensor:
    """Log-probabilities with the given {token: prob} per row (everything else 1e-3)."""
    out = torch.full((len(batch_rows), vocab), 1e-3)
    for r, probs in enumerate(batch_rows):
        for token, p in probs.items():
            out[r, token] = p
    return out.log()


def test_dynamic_tree_keeps_each_rows_most_confident_paths():
    from mmspec.common.dynamic_tree import DynamicTreeBuilder

    build = DynamicTreeBuilder(batch=2, depth=3, top_k=2, total_tokens=4, device="cpu")
    frontier = build.root(_logp([{0: .6, 1: .3}, {5: .5, 4: .45}]))
    assert frontier.tolist() == [[0, 1], [5, 4]]
    level1 = torch.stack([_logp([{2: .9, 3: .05}, {0: .5, 1: .4}]), _logp([{4: .5, 5: .4}, {2: .9, 3: .05}])], 1)
    frontier, parent = build.expand(level1, 1)
    assert frontier.tolist() == [[2, 4], [2, 0]] and parent.tolist() == [[0, 1], [1, 0]]
    # the fed frontier of level 2 hangs from fed nodes 1, 2 (level 1) as each row chose
    fed = build.fed_tree.ancestor_mask
    assert fed[0, 3].nonzero().flatten().tolist() == [0, 1, 3] and fed[1, 3].nonzero().flatten().tolist() == [0, 2, 3]
    level2 = torch.stack([_logp([{1: .8, 0: .1}, {3: .5, 1: .1}]), _logp([{3: .7, 2: .2}, {2: .6, 4: .3}])], 1)
    build.expand(level2, 2)
    tokens, tree = build.finish()
    # row 0: .6 (0), .3 (1) at depth 1, .54 (0 -> 2), .432 (0 -> 2 -> 1); row 1 stays two levels deep
    assert tokens.tolist() == [[0, 1, 2, 1], [5, 4, 2, 0]]
    assert tree.parent.tolist() == [[-1, 0, 0, 1, 3], [-1, 0, 0, 2, 1]]
    assert tree.depth.tolist() == [[0, 1, 1, 2, 3], [0, 1, 1, 2, 2]]
    assert tree.path_table[0, 4].tolist() == [0, 1, 3, 4] and tree.path_table[1, 4].tolist() == [0, 1, 4, -1]
    assert tree.child_table[0, 0].tolist() == [1, 2] and tree.child_table[0, 1].tolist() == [3, -1]
    assert tree.child_table[1, 1].tolist() == [4, -1] and tree.child_table[1, 2].tolist() == [3, -1]
    assert tree.earlier_sibling[0, 2].nonzero().flatten().tolist() == [1]  # 1 is tried before its sibling 2
    assert tree.max_depth == 3 and tree.num_nodes == 4


def test_batch_tree_tables_agree_with_a_static_tree():
    from mmspec.common.dynamic_tree import build_batch_tree

    spec = TreeSpec.full([2, 2, 1])
    tree = build_batch_tree(spec.parent[None].expand(3, -1), spec.depth[None].expand(3, -1), spec.max_depth,
                            spec.level_fan_out)
    for name in ("ancestor_mask", "path_table", "earlier_sibling"):
        assert torch.equal(getattr(tree, name), getattr(spec, name)[None].expand(3, *getattr(spec, name).shape)), name
    assert torch.equal(tree.child_table[:, :, :2], spec.child_table[None].expand(3, -1, -1))


def test_dynamic_tree_settings_are_checked():
    from mmspec.common.dynamic_tree import check_dynamic_tree

    check_dynamic_tree(0, 0, 0)  # off
    with pytest.raises(ValueError, match="tree_top_k must be >= 1"):
        check_dynamic_tree(3, 0, 4)
    with pytest.raises(ValueError, match=r"tree_total_tokens must be between 1 and .* = 12"):
        check_dynamic_tree(2, 3, 13)  # 3 children of the root, 3 x 3 grandchildren
