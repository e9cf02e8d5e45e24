"""``cactus decode`` end to end on the tiny saved pair (``tiny_pair``, ``conftest.py``)."""

import json

import pytest
import torch
from tiny_pair import assert_one_line_naming_the_rule, decode_args, raising_rule_module

from cactus_theory import rules
from cactus_theory.cli import dispatch as cli

pytestmark = pytest.mark.usefixtures("one_torch_thread", "private_cache")


def test_decode_prints_text_and_summary(checkpoints, capsys, tmp_path):
    summary = tmp_path / "summary.json"
    code = cli.main(
        decode_args(
            checkpoints, "--rule", "cactus", "--delta", "1.0", "-k", "3", "--json", str(summary)
        )
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("--- prompt") == 3 and "print(" in out  # \n escapes read as newlines
    for needle in ("AL ", "tokens/s", "speed-up", "accepted drafts per verify step", "NLL"):
        assert needle in out
    assert "nats/token" in out and "nats/sequence" in out  # the divergence meter
    assert "\033[" not in out  # no ANSI codes when stdout is not a terminal
    data = json.loads(summary.read_text())
    assert data["rule"] == "cactus:delta=1.0" and data["k"] == 3
    assert sum(data["speculative"]["accepted_histogram"]) > 0
    assert data["speculative"]["tokens"] == data["baseline"]["tokens"] == 18
    meter = data["speculative"]
    assert meter["kl_per_token"] >= 0 and len(meter["sequence_kl"]) == 3
    assert meter["kl_per_sequence"] == pytest.approx(sum(meter["sequence_kl"]) / 3)


def test_decode_without_the_meter_and_with_a_kl_cap(checkpoints, capsys, tmp_path):
    summary = tmp_path / "s.json"
    args = decode_args(checkpoints, "--rule", "cactus:delta=2", "--no-baseline", "--quiet")
    assert cli.main([*args, "--no-divergence", "--json", str(summary)]) == 0
    assert "divergence meter off" in capsys.readouterr().out
    assert json.loads(summary.read_text())["speculative"]["kl_per_token"] is None
    assert cli.main([*args, "--max-kl", "0.05", "--json", str(summary)]) == 0
    capped = json.loads(summary.read_text())
    assert capped["max_kl"] == 0.05
    assert max(capped["speculative"]["sequence_kl"]) <= 0.05 * (1 + 1e-9)
    assert cli.main([*args, "--max-kl", "0.05", "--no-divergence"]) == 2
    assert "max_kl: needs the divergence meter" in capsys.readouterr().err


def test_decode_greedy_jsonl_prompts_and_rule_spec(checkpoints, capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps("def f(x):") + "\n" + json.dumps({"prompt": "import"}) + "\n")
    args = decode_args(checkpoints, "--rule", "topk:k=3", "--temperature", "0", "--no-baseline")
    args[args.index("--prompts") + 1] = str(prompts)
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert out.count("--- prompt") == 2 and "baseline:" not in out


def test_a_users_rule_module_decodes_with_the_meter_and_a_cap(checkpoints, capsys, tmp_path):
    """``--rules-module my_rules.py`` registers the user's rule for ``--rule``; it decodes
    with the meter and ``--max-kl`` (its ladder: itself, then SpS)."""
    from cactus_theory import rules

    module = tmp_path / "my_rules.py"
    module.write_text(
        "import numpy as np\nfrom cactus_theory import rules\n\n"
        "class Tripled(rules.BranchRule):\n    name = 'test-cli-tripled'\n\n"
        "    def raised_mass(self, target_mass, cap=None):\n"
        "        raised = np.minimum(1.0, 3.0 * target_mass)\n"
        "        return raised if cap is None else np.minimum(raised, cap)\n\n"
        "rules.register(Tripled)\n"
    )
    summary = tmp_path / "s.json"
    args = decode_args(checkpoints, "--rule", "test-cli-tripled", "--no-baseline", "--quiet")
    try:
        code = cli.main([*args, "--rules-module", str(module), "--max-kl", "0.5"])
        assert code == 0
        assert cli.main([*args, "--rules-module", str(module), "--json", str(summary)]) == 0
        out = capsys.readouterr().out
        assert "rule test-cli-tripled" in out and "KL(emitted ‖ verifier)" in out
        assert json.loads(summary.read_text())["speculative"]["kl_per_token"] > 0
    finally:
        rules.REGISTRY.pop("test-cli-tripled", None)
    assert cli.main(args) == 2  # without the module the name is unknown: a usage error
    assert "unknown rule 'test-cli-tripled'" in capsys.readouterr().err


def test_default_pair_is_used_without_model_arguments(checkpoints, capsys, monkeypatch):
    from cactus_theory.decode.runs import Pair

    pair = Pair(checkpoints["verifier"], checkpoints["draft"], checkpoints["prompts"], "test")
    monkeypatch.setattr(cli, "default_pair", lambda: pair)
    code = cli.main(
        ["decode", "--rule", "sps", "--max-new-tokens", "3", "--quiet", "--no-baseline"]
    )
    assert code == 0
    assert checkpoints["verifier"] in capsys.readouterr().out


def test_a_bare_decode_runs_on_the_default_pair(checkpoints, capsys, monkeypatch, tmp_path):
    """``cactus decode`` with no rule, δ or models: the default rule (cactus, δ = 1) on the
    default pair when its verifier is already in the cache, else on the tiny test pair."""
    from cactus_theory.cli import decode
    from cactus_theory.decode.runs import Pair
    from cactus_theory.real import smollm

    present = (smollm.folder() / "verifier-hf" / "config.json").is_file()
    present = present and (smollm.DRAFT_FOLDER / "feature_draft.pt").is_file()
    if not present:
        pair = Pair(checkpoints["verifier"], checkpoints["draft"], checkpoints["prompts"], "test")
        monkeypatch.setattr(cli, "default_pair", lambda: pair)
    summary = tmp_path / "bare.json"
    argv = ["decode", "--max-new-tokens", "4", "--num-prompts", "1", "--json", str(summary)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("--- prompt") == 1 and "speed-up" in out
    data = json.loads(summary.read_text())
    assert data["rule"] == f"{decode.DEFAULT_RULE}:delta={decode.DEFAULT_DELTA}"
    assert data["prompts"] == 1 and data["speculative"]["tokens"] <= 4
    assert data["verifier"] == (str(smollm.folder() / "verifier-hf") if present else pair.verifier)
    # --delta alone sets the default rule's δ; an explicit --rule cactus still needs one.
    assert cli.main([*argv, "--delta", "0.25", "--quiet"]) == 0
    assert json.loads(summary.read_text())["rule"] == f"{decode.DEFAULT_RULE}:delta=0.25"


def test_a_first_decode_takes_a_few_prompts_and_gives_an_interval(
    checkpoints, capsys, monkeypatch, tmp_path
):
    """A bare ``cactus decode`` (no model, prompts or count) decodes the default pair's
    first ``FIRST_PROMPTS`` prompts, each speculatively then plainly, and prints the
    speed-up with its 95% interval, AL, α by draft position and the KL per token;
    ``--num-prompts`` takes more; below 6 paired batches it says why there is no interval
    (the negative control)."""
    from cactus_theory.cli import decode
    from cactus_theory.decode.runs import Pair

    prompts = tmp_path / "many.txt"
    prompts.write_text("\n".join(f"def f{i}(x):" for i in range(9)) + "\n")
    pair = Pair(checkpoints["verifier"], checkpoints["draft"], str(prompts), "test")
    monkeypatch.setattr(cli, "default_pair", lambda: pair)
    summary = tmp_path / "first.json"
    argv = ["decode", "--max-new-tokens", "5", "--quiet", "--json", str(summary)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    data = json.loads(summary.read_text())
    assert data["prompts"] == decode.FIRST_PROMPTS == 6
    assert f"the default pair's first {decode.FIRST_PROMPTS} prompts" in out
    ratios = data["speedup_by_batch"]
    assert len(ratios) == 6 and data["speedup_low"] == min(ratios)
    assert data["speedup_high"] == max(ratios) and data["speedup_low"] < data["speedup_high"]
    line = next(line for line in out.splitlines() if line.startswith("speed-up:"))
    assert f"{data['speedup_median']:.2f}x [{data['speedup_low']:.2f}, " in line
    assert "median of 6 per-batch ratios" in line
    assert "AL " in out and "α by draft position" in out and "nats/token" in out
    # --num-prompts takes more of them; three give no interval, and it says why.
    assert cli.main([*argv, "--num-prompts", "9"]) == 0
    assert json.loads(summary.read_text())["prompts"] == 9
    assert cli.main([*argv, "--num-prompts", "3"]) == 0
    out = capsys.readouterr().out
    assert "no interval: 3 paired batches" in out and "--num-prompts 6" in out
    assert "speedup_low" not in json.loads(summary.read_text())


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"--verifier": "/nonexistent/model/folder"},
            "verifier: path '/nonexistent/model/folder' does not exist",
        ),
        ({"--draft": "other_tokenizer"}, "draft: its tokenizer differs from the verifier's"),
        ({"--draft": "other_vocab"}, "draft: output vocabulary"),
        ({"--prompts": "/nonexistent/prompts.txt"}, "prompts: file"),
        ({"--rule": "cactus"}, "delta: rule 'cactus' needs this parameter"),
        ({"--rule": "sps", "--delta": "1"}, "delta: not a parameter of rule 'sps'"),
        ({"--rule": "bogus"}, "rule: unknown rule"),
        ({"--rule": "sps", "-k": "0"}, "k: must be >= 1"),
        ({"--rule": "sps", "--max-new-tokens": "0"}, "max_new_tokens: must be >= 1"),
        ({"--rule": "sps", "--temperature": "-1"}, "temperature: must be >= 0"),
        ({"--rule": "sps", "--top-p": "1.5"}, "top_p: must lie in (0, 1]"),
        ({"--rule": "sps", "--device": "tpu"}, "device:"),
        ({"--rule": "cactus:delta=0.5", "--delta": "1"}, "delta: given both in --rule"),
        ({"--rule": "cactus:delta=0.5,delta=1"}, "delta: given twice"),
        ({"--verifier": "./missing-model"}, "verifier: path './missing-model' does not exist"),
        ({"--verifier": "missing.gguf"}, "verifier: path 'missing.gguf' does not exist"),
        ({"--rule": "sps", "--json": "/proc/version/x.json"}, "json: cannot write"),
        ({"--rule": "sps", "--max-kl": "-1"}, "max_kl: must be a number >= 0"),
    ],
)
def test_decode_errors_are_clean(checkpoints, capsys, extra, message):
    args = decode_args(checkpoints)
    for flag, value in extra.items():
        value = checkpoints.get(value, value)
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    if "--rule" not in extra:
        args += ["--rule", "sps"]
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err


def test_a_hub_id_offline_is_one_line_within_seconds(checkpoints, capsys, monkeypatch):
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(checkpoints["root"] / "empty-hf-home"))
    args = decode_args(checkpoints, "--rule", "sps")
    args[args.index("--verifier") + 1] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    started = time.perf_counter()
    assert cli.main(args) == 2
    error = capsys.readouterr().err
    assert time.perf_counter() - started < 20
    assert "verifier: 'HuggingFaceTB/SmolLM2-135M-Instruct' is not a local path" in error
    assert "HF_HUB_OFFLINE" in error and "Traceback" not in error


def test_unreachable_hub_is_one_clear_line(checkpoints, capsys, monkeypatch):
    from cactus_theory.decode import loading

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(checkpoints["root"] / "empty-hf-home"))
    monkeypatch.setattr(loading, "_hub_reachable", lambda: False)
    args = decode_args(checkpoints, "--rule", "sps")
    args[args.index("--draft") + 1] = "someone/some-model"
    assert cli.main(args) == 2
    assert "draft: 'someone/some-model' is not a local path" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"text": "x"}\n', 'line 1 of .* has no "prompt" key'),
        (b'{"prompt": 3}\n', "line 1 of .*: the prompt must be a string, got int"),
        (b'"ok"\n[1, 2]\n', "line 2 of .*: the prompt must be a string, got list"),
        (b"not json\n", "line 1 of .* is not JSON"),
        (b"\n\n", "holds no prompt"),
    ],
)
def test_bad_jsonl_prompts_are_clear_errors(content, message, tmp_path):
    from cactus_theory.decode.runs import read_prompts

    path = tmp_path / "p.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"^prompts: .*{message}"):
        read_prompts(str(path))


def test_non_utf8_prompt_file_names_the_file(tmp_path):
    from cactus_theory.decode.runs import read_prompts

    path = tmp_path / "latin1.txt"
    path.write_bytes("café\n".encode("latin-1"))
    with pytest.raises(ValueError, match=f"^prompts: {path} is not UTF-8 text"):
        read_prompts(str(path))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda(checkpoints, capsys):
    assert cli.main(decode_args(checkpoints, "--rule", "sps", "--device", "cuda")) == 2
    assert "device: 'cuda' was requested but CUDA is not available" in capsys.readouterr().err


def test_only_one_model_given(checkpoints, capsys):
    args = ["decode", "--verifier", checkpoints["verifier"], "--rule", "sps"]
    assert cli.main(args) == 2
    assert "verifier: give both --verifier and --draft" in capsys.readouterr().err


def test_help_lists_the_documented_flags(capsys):
    with pytest.raises(SystemExit):
        cli.main(["decode", "--help"])
    text = capsys.readouterr().out
    for flag in (
        "--verifier",
        "--draft",
        "--rule",
        "--delta",
        "-k",
        "--prompts",
        "--device",
        "--dtype",
        "--batch-size",
        "--temperature",
        "--top-k",
        "--top-p",
        "--max-new-tokens",
        "--seed",
        "--no-divergence",
        "--max-kl",
        "--raw",
    ):
        assert flag in text


def test_decode_reads_a_dataset_or_a_prompt_file(checkpoints, capsys):
    """--dataset takes a set name or a file; both --dataset and --prompts is an error."""
    args = decode_args(checkpoints, "--rule", "sps", "--no-baseline", "--quiet")
    at = args.index("--prompts")
    with_dataset = args[:at] + ["--dataset", checkpoints["prompts"]] + args[at + 2 :]
    assert cli.main(with_dataset) == 0
    assert "3 prompts" in capsys.readouterr().out  # the file holds three
    assert cli.main([*args, "--dataset", "heldout"]) == 2
    assert "dataset: give --dataset or --prompts, not both" in capsys.readouterr().err
    assert cli.main(args[:at] + ["--dataset", "no-such-set"] + args[at + 2 :]) == 2
    assert "dataset: 'no-such-set' is neither one of" in capsys.readouterr().err


def test_dtype_auto_is_measured_once_then_read_from_the_cache(checkpoints, capsys, private_cache):
    """The default ``--dtype auto`` measures float32 against bfloat16 once, prints the
    choice with both times, caches it under CACTUS_CACHE and reads it back; a damaged cache
    file is measured again; an explicit --dtype measures nothing."""
    args = decode_args(checkpoints, "--rule", "sps", "--no-baseline", "--quiet", "-k", "2")
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("dtype auto: "))
    assert "ms, bfloat16" in line and "3 tokens at batch 1" in line and "measured now" in line
    chosen = line.split()[2]
    assert chosen in ("float32", "bfloat16") and f"cpu {chosen}" in out
    files = list((private_cache / "dtype-choice").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["dtype"] == chosen
    summary = private_cache / "summary.json"
    assert cli.main([*args, "--json", str(summary)]) == 0
    data = json.loads(summary.read_text())
    assert data["dtype"] == data["dtype_choice"]["dtype"] == chosen
    assert data["dtype_choice"]["cached"] and capsys.readouterr().out
    assert cli.main(args) == 0
    assert f"dtype auto: {chosen} (" in (out := capsys.readouterr().out)
    assert f"cached in {files[0]}" in out
    files[0].write_text('{"dtype": "float32", "seconds": ')  # a damaged file
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "measured now" in out and "Traceback" not in out
    assert json.loads(files[0].read_text())["verify_tokens"] == 3
    assert cli.main([*args, "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "dtype auto" not in out and "cpu bfloat16" in out


def test_the_summary_explains_the_speedup_from_the_runs_own_costs(checkpoints, capsys, tmp_path):
    """The why line: c, v, α by position, AL and (AL+1)/(k c + v) computed from the run's
    timings (JSON) and its counts; batch 1 is the default."""
    summary = tmp_path / "s.json"
    args = ["--rule", "sps", "-k", "3", "--quiet", "--json", str(summary), "--dtype", "float32"]
    argv = decode_args(checkpoints, *args)
    at = argv.index("--batch-size")
    assert cli.main(argv[:at] + argv[at + 2 :]) == 0
    out = capsys.readouterr().out
    data = json.loads(summary.read_text())
    assert ", batch 1, cpu float32" in out
    assert (data["batch_size"], data["dtype"], data["dtype_choice"]) == (1, "float32", None)
    speculative, costs, k = data["speculative"], data["costs"], 3
    timing, base = speculative["timing_s"], data["baseline"]["timing_s"]
    step = (base["total"] - base["prefill"]) / base["verifier_calls"]
    verify = timing["verify"] / timing["verifier_calls"] / step
    assert costs["verify_cost"] == pytest.approx(verify, rel=1e-12)
    al = speculative["acceptance_length"]
    predicted = (al + 1) / (k * costs["draft_cost"] + costs["verify_cost"])
    assert costs["predicted_speedup"] == pytest.approx(predicted, rel=1e-12)
    why = next(line for line in out.splitlines() if line.startswith("why:"))
    assert f"c = {costs['draft_cost']:.3f}" in why and f"v = {verify:.2f}" in why
    assert f"AL {al:.2f}" in why and f"= {predicted:.2f}x, measured {data['speedup']:.2f}x" in why
    alphas = speculative["alpha_by_position"]
    shown = ", ".join("-" if alpha is None else f"{alpha:.2f}" for alpha in alphas)
    assert f"α by draft position [{shown}]" in why
    reached = speculative["reached_by_position"]
    # batch 1: a step per verifier call; a step with one token left drafts nothing.
    assert speculative["steps"] == timing["verifier_calls"] >= reached[0] > 0
    for alpha, n in zip(alphas, reached, strict=True):
        assert (alpha is None) == (n == 0)
        assert n == 0 or alpha * n == pytest.approx(round(alpha * n), abs=1e-9)
    assert ("below 1 because" in out) == (data["speedup"] < 1)
    # three prompts at batch 1: three paired batches, too few for an interval, and why
    assert "no interval: 3 paired batches" in out and len(data["speedup_by_batch"]) == 3


def test_why_lines_name_the_costs_that_make_speculation_lose():
    """Exact text on a hand-made run: v near k + 1 (compute-bound), drafting dearer than
    verifying, few accepted drafts; nothing more when the speed-up is at least 1."""
    from cactus_theory.cli.decode import why_lines
    from cactus_theory.decode.runs import StepCosts, Totals

    totals = Totals(accepted=[0, 1, 0, 1], reached_by_position=[4, 2], accepted_by_position=[2, 0])
    costs = StepCosts(draft_cost=0.5, verify_cost=2.5, other_cost=0.25, predicted_speedup=0.375)
    lines = why_lines(0.3, costs, totals, 2)
    assert lines[0] == (
        "why:         draft cost c = 0.500 and verify call v = 2.50 autoregressive steps "
        "(rest 0.25); α by draft position [0.50, 0.00], AL 0.50: predicted (AL+1)/(k c + v) "
        "= 0.38x, measured 0.30x"
    )
    assert lines[1] == (
        "below 1 because a step costs k c + v = 3.50 autoregressive steps (+ 0.25 rest) but "
        "yields AL + 1 = 1.50 tokens; the verify call of 3 tokens per row costs v = 2.50 "
        "steps, not about 1: the verifier is compute-bound at this batch size and dtype "
        "(batch 1, --dtype auto or a smaller k help); few drafts are accepted (AL 0.50 of k=2)"
    )
    assert why_lines(1.2, costs, totals, 2) == [lines[0].replace("0.30x", "1.20x")]
    dear_draft = StepCosts(draft_cost=1.0, verify_cost=1.0, other_cost=0.0, predicted_speedup=1.5)
    assert "drafting (k c = 2.00 steps) costs more" in why_lines(0.9, dear_draft, totals, 2)[1]
    assert "eat the predicted gain" in why_lines(0.9, dear_draft, totals, 2)[1]
    assert "compute-bound" not in why_lines(0.9, dear_draft, totals, 2)[1]  # v = 1


def test_a_rule_that_raises_is_one_line_naming_it(checkpoints, capsys, tmp_path, monkeypatch):
    monkeypatch.delenv(rules.ENV_MODULES, raising=False)  # restored after --rules-module
    module = raising_rule_module(tmp_path)
    words = decode_args(checkpoints, "--rules-module", module, "--rule", "test-half-written")
    try:
        assert cli.main([*words, "--no-baseline", "--quiet", "--dtype", "float32"]) == 1
    finally:
        rules.REGISTRY.pop("test-half-written", None)
    assert_one_line_naming_the_rule(capsys.readouterr().err, "decode")
