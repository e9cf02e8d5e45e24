"""The conformance suite on the engines installed in the main environment: transformers'
speculative sampling and assisted generation (its known findings), every registered rule in
our torch sampler, and the ``cactus conform`` command. vLLM's engines are checked in
``tests/vllm/test_vllm_conform.py`` (its own environment). Reduced draws, fixed seeds.
"""

import json

import numpy as np
import pytest

from cactus_theory.cli import dispatch
from cactus_theory.testing import conform
from cactus_theory.testing.conformance.adapters import assisted, cactus_torch, hf_transformers

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_transformers_accepts_a_draft_its_draft_gives_probability_zero():
    """transformers' ratio target_n / draft_n is inf at draft_n = 0, so that draft is
    accepted; a rejection whose residual (target − draft)_+ underflows to 0 in float32 makes
    torch.multinomial raise; everything else decides as SpS (exact) and emits SpS's law."""
    adapter = hf_transformers.adapter(assisted=False)
    only = ["exact-decisions", "exact-zero-draft", "exact-zero-target", "law-emitted"]
    report = conform(adapter, draws=10_000, examples=25, only=only)
    statuses = {result.name: result.status for result in report.results}
    failing = {"exact-zero-draft": "failed", "exact-zero-target": "failed"}
    assert statuses == {**{name: "passed" for name in only}, **failing}, str(report)
    assert "raised RuntimeError" in report.failures[1].detail
    example = report.failures[0].counterexample
    ids = np.array(example["draft_ids"])
    draft = np.array(example["draft_probs"])
    engine = np.array(example["engine_token_ids"])
    rows, positions = np.nonzero(np.take_along_axis(draft, ids[..., None], -1)[..., 0] == 0)
    assert any(engine[r, p] == ids[r, p] for r, p in zip(rows, positions, strict=True))


@pytest.mark.skipif(
    not hf_transformers.has_ensemble_weight(),
    reason="assistant_ensemble_weight: transformers 5.25+",
)
def test_transformers_ensemble_weight_is_the_interp_rule():
    adapter = hf_transformers.adapter(weight=0.7, assisted=False)
    assert adapter.rule == "interp:alpha=0.3"
    report = conform(adapter, draws=10_000, examples=20, only=["exact-decisions", "law-emitted"])
    assert report.passed, str(report)


def test_assisted_generation_drafts_at_temperature_squared_and_emits_the_target_law():
    """The assistant's drafts do not follow p_T (they fit p_T², the processors applied
    twice); the emitted tokens follow q_T."""
    drafts = assisted.draft_law(1e-3, 800, seed=0)
    assert drafts.status == "failed"
    assert "against T² = 0.49" in drafts.detail
    squared = assisted.softmax(assisted.DRAFT_LOGITS, assisted.TEMPERATURE**2)
    counts = np.array(drafts.counterexample["counts"])
    from cactus_theory.testing.conformance import stats

    assert stats.chi_square_pvalue(counts, squared) > 1e-3
    output = assisted.output_law(1e-3, 800, seed=0)
    assert output.status == "passed", output.detail


@pytest.mark.parametrize("spec", cactus_torch.every_rule_spec())
def test_every_registered_rule_in_our_sampler_conforms(spec):
    report = conform(
        cactus_torch.adapter(spec),
        draws=5_000,
        examples=12,
        only=["exact-decisions", "exact-truncated", "exact-logits", "law-emitted", "law-logits"],
    )
    assert report.passed, str(report)


def test_cactus_conform_runs_an_engine_and_writes_json(tmp_path, capsys):
    path = tmp_path / "conform.json"
    code = dispatch.main(
        ["conform", "cactus-torch", "--rule", "sps", "--quick", "--jobs", "1", "--json", str(path)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "| exact-decisions | pass |" in out and "| seeded-batch-invariance | n/a |" in out
    data = json.loads(path.read_text())
    report = data["engines"]["cactus-torch"]["reports"][0]
    assert report["rule"] == "sps" and report["passed"]
    assert {p["name"] for p in report["properties"]} >= {"law-emitted", "output-layout"}
    assert data["budget"]["draws"] == 20_000 and "cores" in data["cpu"]


@pytest.mark.parametrize(
    "arguments, message",
    [
        ([], "engines: name one"),
        (["--all", "vllm"], "not both"),
        (["sglangx"], "unknown engine 'sglangx'"),
        (["cactus-torch", "--draws", "0"], "draws: must be >= 1"),
        (["cactus-torch", "--rule", "cactus:delta=-1"], "delta"),
    ],
)
def test_cactus_conform_usage_errors_are_one_line(arguments, message, capsys):
    assert dispatch.main(["conform", *arguments]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_cactus_conform_vllm_without_vllm_says_how_to_run_it(monkeypatch, tmp_path, capsys):
    pytest.importorskip("torch")
    from cactus_theory.testing.conformance import adapters

    if adapters.missing("vllm") is None:
        pytest.skip("vLLM is installed here")
    monkeypatch.setenv("CACTUS_VLLM_VENV", str(tmp_path / "no-venv"))
    assert dispatch.main(["conform", "vllm"]) == 2
    err = capsys.readouterr().err
    assert ".venv-vllm" in err and "scripts/test.sh" in err and "Traceback" not in err
