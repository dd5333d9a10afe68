"""Role assignment (pure, no MPI) and device choice."""

import pytest
import torch

from pal_hpc.config import ConfigError
from pal_hpc.cluster.topology import (assign_roles, node_counts, node_sizes_for, pick_device,
                                   roles_for_layout, uneven_nodes_note)


def _codes(roles):
    """'L' learner, 'A' actor, 'S' solo (both), per rank."""
    return "".join("S" if r.is_solo else "L" if r.is_learner else "A" for r in roles)


def _check_invariants(roles, node_sizes):
    """Every rank has a role; global and local indices are contiguous and unique."""
    assert [r.rank for r in roles] == list(range(len(roles)))
    assert all(r.is_actor or r.is_learner for r in roles)
    actors = [r.actor_index for r in roles if r.is_actor]
    learners = [r.learner_index for r in roles if r.is_learner]
    assert actors == list(range(len(actors)))  # contiguous, in world-rank order
    assert learners == list(range(len(learners)))
    assert all(r.actor_index == -1 for r in roles if not r.is_actor)
    assert all(r.learner_index == -1 for r in roles if not r.is_learner)
    for node, size in enumerate(node_sizes):
        mine = [r for r in roles if r.node == node]
        assert [r.local_rank for r in mine] == list(range(size))
        assert all(r.node_size == size for r in mine)
        assert [r.local_actor_index for r in mine if r.is_actor] == list(
            range(sum(r.is_actor for r in mine)))
        assert [r.local_learner_index for r in mine if r.is_learner] == list(
            range(sum(r.is_learner for r in mine)))
        assert sum(r.is_actor for r in mine) >= 1 and sum(r.is_learner for r in mine) >= 1


@pytest.mark.parametrize("node_sizes, actors, learners, expected", [
    ([1], 0, 0, "S"),                          # solo: one rank does both
    ([1, 1, 1], 0, 0, "SSS"),                  # three solo nodes
    ([1], 1, 1, "S"),                          # counts cannot split a 1-rank node
    ([2], 0, 0, "LA"),
    ([3], 0, 0, "LAA"),
    ([4], 0, 0, "LAAA"),                       # mpiexec -n 4, the default split
    ([5], 0, 0, "LAAAA"),                      # 5/4 rounds to 1
    ([6], 0, 0, "LLAAAA"),                     # 6/4 = 1.5 rounds half up to 2
    ([8], 0, 0, "LLAAAAAA"),
    ([10], 0, 0, "LLLAAAAAAA"),                # 2.5 -> 3 (not banker's 2)
    ([16], 0, 0, "LLLL" + "A" * 12),
    ([4], 0, 2, "LLAA"),                       # learners given, actors fill the rest
    ([4], 2, 0, "LLAA"),                       # actors given, learners fill the rest
    ([4], 3, 1, "LAAA"),
    ([8], 0, 0.5, "LLLLAAAA"),                 # fraction of the node
    ([8], 0.25, 0, "LLLLLLAA"),
    ([8], 0.75, 0.25, "LLAAAAAA"),
    ([3], 0, 0.1, "LAA"),                      # a fraction still gives at least 1
    ([2, 2], 0, 0, "LALA"),                    # two (virtual) nodes
    ([4, 2, 1], 0, 0, "LAAALAS"),
    ([4, 4], 2, 2, "LLAALLAA"),
])
def test_assign_roles(node_sizes, actors, learners, expected):
    roles = assign_roles(sum(node_sizes), node_sizes, actors, learners)
    assert _codes(roles) == expected
    _check_invariants(roles, node_sizes)


def test_global_indices_span_nodes():
    roles = assign_roles(8, [4, 4])
    assert [r.learner_index for r in roles] == [0, -1, -1, -1, 1, -1, -1, -1]
    assert [r.actor_index for r in roles] == [-1, 0, 1, 2, -1, 3, 4, 5]
    assert [r.local_actor_index for r in roles] == [-1, 0, 1, 2, -1, 0, 1, 2]
    assert [r.node for r in roles] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_solo_rank_has_both_indices():
    (r,) = assign_roles(1, [1])
    assert (r.actor_index, r.learner_index, r.local_actor_index, r.local_learner_index) == (
        0, 0, 0, 0)


@pytest.mark.parametrize("world, k, sizes", [
    (4, 2, [2, 2]), (3, 2, [2, 1]), (5, 2, [2, 2, 1]), (4, 4, [4]), (3, 8, [3]),
    (1, 1, [1]), (7, 3, [3, 3, 1]),
])
def test_node_sizes_for_virtual_nodes(world, k, sizes):
    assert node_sizes_for(world, k) == sizes
    _check_invariants(assign_roles(world, sizes), sizes)


def test_node_sizes_for_rejects_zero():
    with pytest.raises(ConfigError, match="^ranks_per_node: "):
        node_sizes_for(4, 0)


@pytest.mark.parametrize("sizes, k, expected", [
    ([2, 2], 2, ""),                                    # even
    ([3], 0, ""),                                       # real nodes: not ours to judge
    ([2, 1], 2, "uneven virtual nodes of 2 + 1 ranks; 1 node of 1 rank runs solo"),
    ([2, 1, 2, 1], 2, "of 2 + 1 + 2 + 1 ranks; 2 nodes of 1 rank run solo"),
    ([3, 3, 2], 3, "ranks_per_node 3 makes uneven virtual nodes of 3 + 3 + 2 ranks"),
])
def test_uneven_virtual_nodes_are_announced(sizes, k, expected):
    note = uneven_nodes_note(sizes, k)
    assert (expected in note) if expected else note == ""
    assert ("solo" in note) == (1 in sizes and bool(expected))


def test_virtual_nodes_of_three_ranks():
    roles = assign_roles(3, node_sizes_for(3, 2))
    assert _codes(roles) == "LAS"
    assert [r.node for r in roles] == [0, 0, 1]
    assert [r.learner_index for r in roles] == [0, -1, 1]
    assert [r.actor_index for r in roles] == [-1, 0, 1]


def test_non_contiguous_nodes():
    # Two hosts filled round robin: world ranks 0,2,4,6 on node 0 and 1,3,5,7 on node 1.
    layout = [(rank % 2, rank // 2) for rank in range(8)]
    roles = roles_for_layout(layout)
    assert _codes(roles) == "LLAAAAAA"
    assert [r.node for r in roles] == [0, 1] * 4
    assert [r.learner_index for r in roles][:2] == [0, 1]
    assert [r.actor_index for r in roles] == [-1, -1, 0, 1, 2, 3, 4, 5]
    # A contiguous layout gives exactly what assign_roles gives.
    contiguous = [(n, i) for n, size in enumerate([3, 2]) for i in range(size)]
    assert roles_for_layout(contiguous, 0, 0) == assign_roles(5, [3, 2])


@pytest.mark.parametrize("node_sizes, actors, learners, pattern", [
    ([4], 0, 4, r"^learners_per_node: 4 learners \+ 1 actor need 5 ranks per node, "
                r"but node 0 has 4$"),
    ([4], 0, 5, r"^learners_per_node: 5 learners"),
    ([4], 3, 2, r"^learners_per_node: 2 learners \+ 3 actors need 5 ranks per node, "
                r"but node 0 has 4$"),
    ([4], 4, 0, r"^actors_per_node: 1 learner \+ 4 actors need 5"),
    ([2, 4], 0, 3, r"^learners_per_node: .* but node 0 has 2$"),
    ([4, 2], 2, 0, r"^actors_per_node: .* but node 1 has 2$"),
    ([2], 0, 0.9, r"^learners_per_node: 2 learners"),
    ([4], 1, 1, r"^actors_per_node: 1 learner \+ 1 actor leave 2 of node 0's 4 ranks "
                r"without a role"),
    ([8], 0.25, 0.25, r"^actors_per_node: .* leave 4 of node 0's 8 ranks"),
    ([4], -1, 0, r"^actors_per_node: must be auto, 0 \(the default split\), a fraction"),
    ([4], 0, 1.5, r"^learners_per_node: must be auto, 0 \(the default split\), a fraction"),
    ([1], 0, -2, r"^learners_per_node: "),  # checked even where the node is solo
])
def test_bad_counts_name_the_field(node_sizes, actors, learners, pattern):
    with pytest.raises(ConfigError, match=pattern):
        assign_roles(sum(node_sizes), node_sizes, actors, learners)


def test_inconsistent_layout_is_a_value_error():
    with pytest.raises(ValueError, match="sum to the world size"):
        assign_roles(5, [2, 2])
    with pytest.raises(ValueError, match=">= 1"):
        assign_roles(2, [2, 0])
    with pytest.raises(ValueError, match="local ranks"):
        roles_for_layout([(0, 0), (0, 0)])
    with pytest.raises(ValueError, match="node ids"):
        roles_for_layout([(0, 0), (2, 0)])


def test_node_counts():
    assert node_counts(0, 1) == (1, 1)
    assert node_counts(0, 4) == (1, 3)
    assert node_counts(0, 12, learners_per_node=0.5) == (6, 6)


def test_pick_device_cpu():
    assert pick_device("cpu", 0) == torch.device("cpu")
    with pytest.raises(ConfigError, match="^device: "):
        pick_device("tpu", 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_pick_device_without_gpu():
    assert pick_device("auto", 3) == torch.device("cpu")
    with pytest.raises(ConfigError, match=r"^device: cuda requested but "
                                          r"torch.cuda.is_available\(\) is False$"):
        pick_device("cuda", 0)


