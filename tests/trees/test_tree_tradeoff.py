"""The tree trade-off on a pool (``real.tree_tradeoff``): packed rows with padding columns,
every configuration exact against per-node enumeration, and the frontier dominating."""

import math

import numpy as np
import pytest
from nodes import random_row

from cactus_theory import divergences, trees
from cactus_theory.real import tree_tradeoff
from cactus_theory.real.pools import RealPool


def synthetic_pool(rows: int = 30, width: int = 7, seed: int = 0) -> RealPool:
    """Packed rows: 5 real columns and 2 padding columns (id = V, both rows 0)."""
    rng = np.random.default_rng(seed)
    target = np.zeros((rows, width), dtype=np.float32)
    draft = np.zeros_like(target)
    for row in range(rows):
        target[row, :5] = random_row(rng, 5, zeros=False)
        draft[row, :5] = random_row(rng, 5, zeros=True)
    ids = np.tile(np.array([3, 9, 11, 20, 41, 50, 50], dtype=np.int32), (rows, 1))
    zero = np.zeros(rows, dtype=np.int64)
    return RealPool(target, draft, ids, 50, zero, zero, zero, {})


def test_every_configuration_equals_per_node_enumeration():
    pool = synthetic_pool(rows=12)
    target, draft = pool.rows(slice(None))
    result = tree_tradeoff.tree_tradeoff(pool, widths=(1, 2), k_max=3)
    assert tree_tradeoff.violations(result) == []
    for config in result:
        for row in config.rows:
            if row.method == "not computed":
                continue
            rule = (
                trees.make("optimal", scheme=config.scheme)
                if row.spec.startswith("optimal")
                else trees.parse(row.spec)
            )
            accepted, kl = [], []
            for r in range(target.shape[0]):
                if config.scheme == trees.DETERMINISTIC:
                    children = list(tree_tradeoff.top_children(draft[r : r + 1], config.width)[0])
                    node = trees.Node(target=target[r], draft=draft[r], children=children)
                else:
                    fits = min(config.width, int(np.count_nonzero(draft[r])))
                    fits = config.width if config.scheme == trees.WITH_REPLACEMENT else fits
                    node = trees.Node(
                        target=target[r], draft=draft[r], k=fits, scheme=config.scheme
                    )
                exact = trees.enumerate_node(rule, node)
                accepted.append(exact.acceptance)
                kl.append(float(divergences.kl(exact.law, target[r])))
            assert row.acceptance == pytest.approx(np.mean(accepted), abs=1e-12), row.spec
            assert row.kl_per_token == pytest.approx(np.mean(kl), abs=1e-12), row.spec
            if config.scheme != trees.WITHOUT_REPLACEMENT:
                assert math.isfinite(row.frontier_acceptance)
                assert row.acceptance <= row.frontier_acceptance + 1e-12


def test_the_deterministic_pool_frontier_is_cactus_tree_at_equal_budgets():
    """With one budget per row the frontier is the two-level tilt, so Cactus-tree at δ
    sits on the per-row frontier; the pool frontier (budget shared) is at least it."""
    pool = synthetic_pool(seed=1)
    config = tree_tradeoff.configuration(pool, trees.DETERMINISTIC, 2, ["cactus-tree:delta=0.5"])
    row = config.rows[0]
    assert row.frontier_acceptance >= row.acceptance - 1e-12
    assert row.frontier_acceptance - row.acceptance < 0.02  # Jensen gap across rows only


def test_not_computed_rows_say_so_and_json_csv_round_trip():
    pool = synthetic_pool()
    config = tree_tradeoff.configuration(
        pool, trees.WITH_REPLACEMENT, 5, ["cactus-rrs:delta=1", "rrs"]
    )
    methods = {row.spec: row.method for row in config.rows}
    assert methods == {"cactus-rrs:delta=1.0,exact=True": "not computed", "rrs": "closed form"}
    data = tree_tradeoff.to_json([config], dataset="synthetic")
    assert data["configurations"][0]["rows"][0]["acceptance"] is None
    lines = tree_tradeoff.csv_text(data).splitlines()
    assert lines[0].startswith("scheme,width,rule,method") and len(lines) == 3
    with pytest.raises(ValueError, match="^rule: k-seq is not defined for deterministic"):
        tree_tradeoff.configuration(pool, trees.DETERMINISTIC, 2, ["k-seq"])


def test_the_figures_draw_from_results(tmp_path):
    from paper_figs.figures_trees import figure_khisti, tree_tradeoff_figure
    from proofs_check.checks_trees_findings import figure2

    pool = synthetic_pool(rows=8)
    chosen = {
        trees.DETERMINISTIC: ["walk", "cactus-tree:delta=1"],
        trees.WITH_REPLACEMENT: ["rrs", "k-seq"],
        trees.WITHOUT_REPLACEMENT: ["rrs"],
    }
    result = tree_tradeoff.tree_tradeoff(pool, widths=(1, 2), rules=chosen)
    data = tree_tradeoff.to_json(result, dataset="x")
    drawn = tree_tradeoff_figure(data, tmp_path)
    assert drawn.png.stat().st_size > 10_000 and set(drawn.series) == set(tree_tradeoff.SCHEMES)
    curves = figure2(points=9)
    khisti = figure_khisti(curves, tmp_path)
    assert khisti.png.stat().st_size > 10_000
    for reading in ("draft uniform", "target uniform"):
        best = np.asarray(curves[reading]["optimal"])
        assert np.all(np.asarray(curves[reading]["rrs"]) <= best + 1e-12)
