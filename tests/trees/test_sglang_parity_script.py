"""scripts/sglang_tree_parity.py (the GPU check's SGLang stage) on CPU with the kernel's
loop in Python: the harness lays the tensors out as the kernel reads them, agrees with
``trees.verify_node`` token for token, and catches a kernel that differs."""

import importlib.util
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sglang_tree_parity.py"


def load():
    spec = importlib.util.spec_from_file_location("sglang_tree_parity", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_harness_agrees_with_the_kernel_loop_and_catches_a_different_kernel(monkeypatch):
    parity = load()
    report = parity.run(150, mock=True)
    assert report["passed"] and sum(item["nodes"] for item in report["settings"]) == 600
    original = parity.mock_kernel

    def skewed(tensors, coins, finals, single, acc):  # a kernel reading t_a as 0.9 t_a
        return original(tensors, coins, finals, single, 0.9 * acc)

    monkeypatch.setattr(parity, "mock_kernel", skewed)
    report = parity.run(150, mock=True)
    assert not report["passed"]
    assert report["settings"][0]["mismatches"] > 0  # thresholds (1, 1): the walk itself
    assert np.isclose(report["settings"][0]["threshold_acc"], 1.0)
