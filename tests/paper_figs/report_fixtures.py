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


FAKE_TABLE = {
    "pair": "fake",
    "verifier": "verifier-folder",
    "draft": "draft-folder",
    "dtype": "bfloat16",
    "threads": 1,
    "settings": {
        "num_prompts": 2,
        "max_new_tokens": 8,
        "batch_size": 1,
        "seed": 0,
        "sampling": {"temperature": 0.6, "top_k": 20, "top_p": 0.95},
    },
    "rows": [
        {
            "rule": "autoregressive",
            "label": "autoregressive",
            "k": 0,
            "acceptance_length": 0.0,
            "tokens_per_call": 1.0,
            "tokens_per_second": 10.0,
            "speedup": 1.0,
            "kl_per_token": None,
            "verifier_nll": 1.2,
        },
        {
            "rule": "sps",
            "label": "sps",
            "k": 5,
            "acceptance_length": 1.5,
            "tokens_per_call": 2.5,
            "tokens_per_second": 14.0,
            "speedup": 1.4,
            "kl_per_token": 0.0,
            "verifier_nll": 1.2,
            "alpha": 0.5,
            "cost_ratio": 0.1,
            "predicted_speedup": 1.3,
            "sampler_share": 0.02,
        },
        {
            "rule": "cactus:delta=1.0",
            "label": "cactus(δ=1.0)",
            "k": 5,
            "acceptance_length": 2.5,
            "tokens_per_call": 3.5,
            "tokens_per_second": 19.0,
            "speedup": 1.9,
            "kl_per_token": 0.05,
            "verifier_nll": 1.3,
            "alpha": 0.7,
            "cost_ratio": 0.1,
            "predicted_speedup": 2.0,
            "sampler_share": 0.02,
        },
    ],
}


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
    "datasets": {"mt-bench": FAKE_TABLE},
    "timings": {"load": 1.0, "pools": 2.0, "tradeoff": 0.5, "decode_table": 3.0},
}


def fake_real_model(folder, *, quick, progress):
    from cactus_theory.real import tradeoff

    (folder / "real_model.json").write_text(json.dumps(FAKE_REAL_MODEL))
    (folder / "real-tradeoff-mt-bench.csv").write_text(tradeoff.csv_text(FAKE_DOCUMENT))
    return FAKE_REAL_MODEL
