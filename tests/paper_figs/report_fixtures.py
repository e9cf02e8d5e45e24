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
