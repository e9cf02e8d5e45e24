"""The tree-shape search (``core.trees.shape_search``) against brute force: every template
with up to 6 nodes and depth up to 3, its expected accepted length by the formula, and the
choice that maximises (1 + E) / cost."""

import itertools

import numpy as np
import pytest

from cactus_theory.core.trees import shape_search


def all_templates(max_nodes: int, max_depth: int):
    """Every breadth-first template (siblings in rank order) with 1..max_nodes nodes."""
    found = set()
    for nodes in range(1, max_nodes + 1):
        for parents in itertools.product(range(nodes), repeat=nodes):
            if any(parent >= node for node, parent in enumerate(parents, start=1)):
                continue
            depth = shape_search.template_depths(parents)
            rising = all(a <= b for a, b in zip(depth[1:], depth[2:], strict=False))
            if max(depth) > max_depth or not rising:
                continue
            if list(parents) != sorted(parents):  # breadth-first: parents non-decreasing
                continue
            found.add(tuple(parents))
    return sorted(found, key=len)


def test_expected_accepted_length_is_the_sum_over_paths():
    table = np.array([[0.5, 0.2], [0.4, 0.1]])
    # root -> a (rank 0), b (rank 1); a -> c (rank 0): 0.5 + 0.2 + 0.5 * 0.4
    assert shape_search.expected_accepted((0, 0, 1), table) == pytest.approx(0.9)
    assert shape_search.expected_accepted((0, 1, 2), table) == pytest.approx(0.5 + 0.2 + 0.0)


@pytest.mark.parametrize("seed", range(6))
def test_best_templates_are_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    table = np.sort(rng.random((3, 3)) * 0.8, axis=1)[:, ::-1]  # α falls with rank
    if seed % 2:
        table = rng.random((3, 3)) * 0.6  # any table, not only decreasing in rank
    templates = all_templates(6, 3)
    best = shape_search.best_templates(table, 6, 3)
    for nodes in range(1, 7):
        candidates = [t for t in templates if len(t) <= nodes]
        optimum = max(shape_search.expected_accepted(t, table) for t in candidates)
        value, parents = best[nodes]
        assert value == pytest.approx(optimum, abs=1e-12)
        assert len(parents) <= nodes
        assert shape_search.expected_accepted(parents, table) == pytest.approx(value, abs=1e-12)


def test_the_choice_maximises_tokens_per_cost():
    table = np.array([[0.6, 0.25, 0.1], [0.5, 0.2, 0.05], [0.4, 0.1, 0.0]])
    draft = {1: 0.1, 2: 0.11, 3: 0.12}

    def draft_cost(size):
        return draft.get(size, 0.1 + 0.01 * size)

    def verify_cost(size):
        return 1.0 + 0.05 * size

    choice = shape_search.choose_template(table, 6, draft_cost, verify_cost, rest_cost=0.2)
    rates = []
    for parents in all_templates(6, 3):
        cost = sum(draft_cost(size) for size in shape_search.frontier_sizes(parents))
        cost += verify_cost(len(parents) + 1) + 0.2
        rates.append((1 + shape_search.expected_accepted(parents, table)) / cost)
    assert choice.tokens_per_cost == pytest.approx(max(rates), abs=1e-12)
    assert choice.spec.startswith("parents:")
    with pytest.raises(ValueError, match="max_nodes"):
        shape_search.choose_template(table, 0, draft_cost, verify_cost)
