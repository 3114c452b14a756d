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
