"""A stand-in claims result for report tests (the real check runs in its own tests)."""

import json

FAKE_CLAIMS = {
    "claims": [
        {
            "id": "thm1",
            "statement": "generalised SpS emits exactly h",
            "owner": "paper",
            "verdict": "holds",
            "instances": 1000,
            "worst_case": 2e-16,
            "counterexample": None,
        },
        {
            "id": "cor6",
            "statement": "γ* <= 0.5 implies KL(h||q) <= δ",
            "owner": "paper",
            "verdict": "fails",
            "instances": 1000,
            "worst_case": 1.7,
            "counterexample": {"q_n": 0.3, "delta": 1.0},
        },
    ],
    "curves": {
        "khisti_figure2": {
            "x": [0.0, 0.5, 1.0],
            "uniform draft": {
                "optimal": [0.9, 0.8, 0.7],
                "k-seq": [0.85, 0.78, 0.7],
                "rrs": [0.8, 0.75, 0.68],
                "rrs-wor": [1.0, 0.85, 0.7],
                "k=1": [0.6, 0.5, 0.4],
            },
            "uniform target": {
                "optimal": [0.88, 0.8, 0.7],
                "k-seq": [0.84, 0.77, 0.69],
                "rrs": [0.8, 0.74, 0.67],
                "rrs-wor": [0.95, 0.84, 0.7],
                "k=1": [0.6, 0.5, 0.4],
            },
        },  # fmt: skip
        "gamma": {
            "delta": [0.01, 0.1, 1.0],
            "rules": {
                "cactus": [0.02, 0.15, 1.2],
                "cactus-exact": [0.015, 0.13, 1.1],
                "frontier": [0.01, 0.1, 1.0],
            },
        },
        "branch_overshoot": {
            "delta": [0.01, 0.1, 1.0],
            "measured": [1.01, 1.1, 1.4],
            "analytic": [1.01, 1.1, 1.4],
        },
    },
}


def fake_claims(folder, *, quick, seed, progress):
    (folder / "claims.json").write_text(json.dumps(FAKE_CLAIMS))
    (folder / "claims.md").write_text("claims (fake)\n")
    return FAKE_CLAIMS


def _round(step: float, draft: float, verify: float, other: float, speed: float) -> dict:
    return {
        "tokens_per_second": speed, "step_seconds": step, "prefill_share": 0.05,
        "draft_cost": draft, "verify_cost": verify, "other_cost": other,
        "acceptance_length": 0.5,
    }  # fmt: skip


def fake_speed() -> dict:
    """A speed check (``real.speed_check.summarise``) of a made-up 6-round decode table:
    SpS and Cactus δ = 1 at k = 3, costs that vary a little from round to round."""
    from cactus_theory.real import speed_check

    rounds = range(6)
    base = {"rule": "autoregressive", "label": "autoregressive", "tokens": 144,
            "tokens_per_second": 10.0,
            "per_round": [{"tokens_per_second": 10.0 + r / 10, "step_seconds": 0.1,
                           "prefill_share": 0.05} for r in rounds]}  # fmt: skip
    rows = [base]
    for spec, label, al, speed in (
        ("sps", "sps", 0.5, 11.0),
        ("cactus:delta=1.0", "cactus(δ=1.0)", 0.8, 12.5),
    ):
        rows.append(
            {
                "rule": spec,
                "label": label,
                "k": 3,
                "acceptance_length": al,
                "tokens": 144,
                "tokens_per_call": al + 1,
                "steps": int(144 / (al + 1)),
                "tokens_per_second": speed,
                "speedup": speed / 10,
                "speedup_low": speed / 10.5,
                "speedup_high": speed / 9.5,
                "speedup_coverage": 0.97,
                "alpha_by_position": [0.45, 0.3, 0.2],
                "kl_per_token": 0.0 if al < 0.6 else 0.1,
                "per_round": [
                    _round(0.1, 0.05 + r / 1000, 1.1 + r / 100, 0.1, speed) for r in rounds
                ],
            }  # fmt: skip
        )
    found = speed_check.summarise(
        {"rows": rows}, {"sps": 0.45, "cactus:delta=1.0": 0.58}, speed_check.SpeedSettings()
    )
    return {**found, "dataset": "mt-bench", "dtype": "float32", "threads": 1}


def synthetic_pool():
    """200 positions of Dirichlet rows over 30 tokens, as a ``RealPool``."""
    import numpy as np

    from cactus_theory.real import pools

    generator = np.random.default_rng(0)
    target = generator.dirichlet(np.full(30, 0.3), size=200).astype(np.float32)
    draft = (0.6 * target + 0.4 * generator.dirichlet(np.full(30, 0.3), size=200)).astype(
        np.float32
    )
    zeros = np.zeros(200, np.int64)
    return pools.RealPool(target, draft, None, 30, zeros, zeros, zeros)


def synthetic_trees() -> dict:
    """A real ``tree_tradeoff.to_json`` document on the synthetic pool (top-K, K = 1, 2)."""
    from cactus_theory.real import tree_tradeoff

    found = tree_tradeoff.tree_tradeoff(synthetic_pool(), widths=(1, 2), schemes=("deterministic",))
    return tree_tradeoff.to_json(found, dataset="mt-bench", positions=200)


def synthetic_tradeoff() -> dict:
    """A real ``tradeoff.to_json`` document, computed on a synthetic pool (200 positions
    of Dirichlet rows over 30 tokens) instead of a model's."""
    import numpy as np

    from cactus_theory.real import pools, tradeoff

    generator = np.random.default_rng(0)
    target = generator.dirichlet(np.full(30, 0.3), size=200).astype(np.float32)
    draft = (0.6 * target + 0.4 * generator.dirichlet(np.full(30, 0.3), size=200)).astype(
        np.float32
    )
    zeros = np.zeros(200, np.int64)
    pool = pools.RealPool(target, draft, None, 30, zeros, zeros, zeros)
    found = tradeoff.tradeoff(pool, tradeoff.default_rules(), k_max=5)
    return tradeoff.to_json(found, pair={"name": "fake"}, settings={"dataset": "mt-bench"})


FAKE_DOCUMENT = synthetic_tradeoff()
FAKE_SPEED = fake_speed()
FAKE_TREES = synthetic_trees()
FAKE_REAL_MODEL = {
    "pair": {"name": "fake", "verifier": "verifier-folder", "draft": "draft-folder"},
    "device": "cpu",
    "dtype": "bfloat16",
    "threads": 1,
    "pool_settings": {
        "positions": 200,
        "num_prompts": 8,
        "max_new_tokens": 32,
        "batch_size": 4,
        "seed": 0,
        "sampling": {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "label": "T=0.6"},
    },  # fmt: skip
    "tradeoff": {
        "mt-bench": {
            "document": FAKE_DOCUMENT,
            "pool": "200 positions from 8 prompts (whole rows)",
            "pool_info": {},
            "violations": [],
            "seconds": {"pool": 1.0, "tradeoff": 0.5},
            "csv": "real-tradeoff-mt-bench.csv",
        }
    },
    "speed": FAKE_SPEED,
    "trees": {
        "dataset": "mt-bench",
        "document": FAKE_TREES,
        "csv": "real-tree-tradeoff-mt-bench.csv",
        "seconds": 1.0,
    },
    "costs": FAKE_SPEED["costs"],
    "timings": {"load": 1.0, "pools": 2.0, "theory": 0.5, "speed": 3.0},
}


def fake_real_model(folder, *, quick, progress):
    from cactus_theory.real import tradeoff

    (folder / "real_model.json").write_text(json.dumps(FAKE_REAL_MODEL))
    from cactus_theory.real import tree_tradeoff

    (folder / "real-tradeoff-mt-bench.csv").write_text(tradeoff.csv_text(FAKE_DOCUMENT))
    (folder / "real-tree-tradeoff-mt-bench.csv").write_text(tree_tradeoff.csv_text(FAKE_TREES))
    return FAKE_REAL_MODEL


FAKE_CONFORMANCE = {
    "cpu": "a CPU (2 cores)",
    "budget": {"draws": 100, "examples": 2, "seed": 0},
    "seconds": 1.0,
    "engines": {
        "cactus-torch": [
            {
                "engine": "cactus-torch",
                "version": "0",
                "rule": "sps",
                "properties": [{"name": "law-emitted", "status": "passed", "detail": "ok"}],
            }
        ]
    },
    "missing": {"vllm": "not importable here"},
    "matrix": {"properties": ["law-emitted"], "columns": ["cactus-torch"], "cells": [["pass"]]},
    "acceptance": [],
}


def fake_conformance(folder, *, quick):
    return FAKE_CONFORMANCE
