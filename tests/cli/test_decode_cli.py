"""``cactus decode``, ``cactus bench decode`` and ``cactus bench sampler`` end to end.

Tiny Llama checkpoints with a tiny byte-level BPE tokenizer are saved with
``save_pretrained`` into a temporary folder and loaded back by path, as users do.
"""

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from cactus_theory.cli import dispatch as cli

pytestmark = pytest.mark.usefixtures("one_torch_thread", "private_cache")


@pytest.fixture
def private_cache(tmp_path_factory, monkeypatch):
    """A temporary CACTUS_CACHE: ``--dtype auto`` caches its choice there, never in the
    user's cache."""
    folder = tmp_path_factory.mktemp("cactus-cache")
    monkeypatch.setenv("CACTUS_CACHE", str(folder))
    return folder


TEXT = [
    "def main(argv):\n    return 0\n",
    "import os\nprint(os.getcwd())\n",
    "class A:\n    pass\n",
]


def make_tokenizer(vocab_size, text=TEXT):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


def save_model(folder, tokenizer, vocab, seed, layers):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        max_position_embeddings=256,
        eos_token_id=0,
        pad_token_id=0,
        bos_token_id=0,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tokenizer = make_tokenizer(300)
    vocab = len(tokenizer)
    other = make_tokenizer(300, ["zebra quokka yak\n", "lorem ipsum dolor\n"])
    prompts = root / "prompts.txt"
    prompts.write_text("def main(\nimport os\\nprint(\n\nclass A:\n")
    return {
        "verifier": save_model(root / "verifier", tokenizer, vocab, 0, 2),
        "draft": save_model(root / "draft", tokenizer, vocab, 1, 1),
        "other_tokenizer": save_model(root / "other", other, len(other), 2, 1),
        "other_vocab": save_model(root / "wide", tokenizer, vocab + 8, 3, 1),
        "prompts": str(prompts),
        "root": root,
    }


def decode_args(checkpoints, *extra):
    return [
        "decode",
        "--verifier",
        checkpoints["verifier"],
        "--draft",
        checkpoints["draft"],
        "--prompts",
        checkpoints["prompts"],
        "--max-new-tokens",
        "6",
        "--batch-size",
        "2",
        *extra,
    ]


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


def test_bench_decode_table(checkpoints, capsys, tmp_path):
    output = tmp_path / "decode.json"
    args = [
        "bench",
        "decode",
        "--json",
        str(output),
        "--verifier",
        checkpoints["verifier"],
        "--draft",
        checkpoints["draft"],
        "--prompts",
        checkpoints["prompts"],
        "--max-new-tokens",
        "4",
        "--rule",
        "sps",
        "--rule",
        "cactus:delta=1.0",
        "-k",
        "2",
        "3",
        "--repeats",
        "2",
    ]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "autoregressive" in out and out.count("cactus(δ=1.0)") == 2 and "speed-up" in out
    assert "median of 2 interleaved rounds" in out
    # Two rounds give no 95% interval: no speed-up at all, "-" in both columns, and why.
    assert "no speed-up given: 2 interleaved rounds" in out and "x [" not in out
    # Every round reseeds: the same tokens in each round on CPU, so AL is exact.
    table = json.loads(output.read_text())
    rows = table["rows"]
    assert len(rows) == 5 and all(row["rounds_agree"] for row in rows)
    assert "at least 6" in table["speedup_note"]
    for row in rows:
        assert row["speedup"] is None and "speedup_low" not in row
        assert "speedup_coverage" not in row
    assert cli.main([*args[:-2], "--repeats", "0"]) == 2
    assert "repeats" in capsys.readouterr().err


def test_the_speedup_interval_is_the_order_statistic_interval_of_the_median():
    """Exact: the largest j with P(Binomial(R, 1/2) < j) <= 0.025 gives [s_(j), s_(R+1-j)]
    (R = 6: j = 1, coverage 1 - 2/64; R = 10: j = 2, coverage 1 - 2 * 11/1024); below six
    rounds the range, with coverage 1 - 2^(1-R)."""
    from cactus_theory.real.decode_table import median_interval

    assert median_interval([3.0, 1.0, 2.0, 6.0, 5.0, 4.0]) == (3.5, 1.0, 6.0, 1 - 2 / 64)
    ten = [float(value) for value in range(10, 0, -1)]
    assert median_interval(ten) == (5.5, 2.0, 9.0, 1 - 22 / 1024)
    assert median_interval([1.0, 2.0, 4.0]) == (2.0, 1.0, 4.0, 0.75)
    assert median_interval([1.5]) == (1.5, 1.5, 1.5, 0.0)


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


def test_bench_sampler_small(capsys, tmp_path):
    output = tmp_path / "s.json"
    args = [
        "bench",
        "sampler",
        "--batch",
        "3",
        "-k",
        "2",
        "--vocab",
        "50",
        "--repeats",
        "1",
        "--json",
        str(output),
    ]
    assert cli.main(args) == 0
    rows = json.loads(output.read_text())["rows"]
    assert [row["rule"] for row in rows] == [
        "sps",
        "cactus(δ=1.0)",
        "cactus-exact(δ=0.5)",
        "frontier(δ=1.0)",
    ]
    assert all(row["dense_over_ours"] > 0 and row["ours_over_floor"] > 0 for row in rows)
    assert rows[1]["ours_over_cactus"] == 1.0
    assert cli.main(["bench", "sampler", "--vocab", "1"]) == 2


def test_bench_sampler_workloads_side_by_side(capsys, tmp_path):
    output = tmp_path / "w.json"
    args = ["bench", "sampler", "--workload", "2x2x50", "--workload", "1x3x5000"]
    args += ["--rule", "sps", "--rule", "cactus:delta=1.0", "--rule", "frontier:delta=0.2"]
    assert cli.main([*args, "--repeats", "1", "--json", str(output)]) == 0
    out = capsys.readouterr().out
    assert "summary (one run)" in out and "ours/cactus" in out
    payload = json.loads(output.read_text())
    assert [(w["batch"], w["k"], w["vocab"]) for w in payload["workloads"]] == [
        (2, 2, 50),
        (1, 3, 5000),
    ]
    rows = payload["rows"]
    assert [row["workload"] for row in rows] == ["2x2x50"] * 3 + ["1x3x5000"] * 3
    assert all(row["ours_over_cactus"] > 0 for row in rows)
    assert cli.main(["bench", "sampler", "--workload", "64x10"]) == 2
    assert "workload" in capsys.readouterr().err


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
    assert "one run, no interval" in out


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


def bench_args(checkpoints, output, *extra):
    return [
        "bench", "decode", "--json", str(output), "--verifier", checkpoints["verifier"],
        "--draft", checkpoints["draft"], "--prompts", checkpoints["prompts"],
        "--max-new-tokens", "4", "--rule", "sps", "--rule", "cactus:delta=1.0",
        "--dtype", "float32", *extra,
    ]  # fmt: skip


def test_bench_decode_rows_carry_alpha_by_position_steps_and_verify_cost(
    checkpoints, capsys, tmp_path
):
    """Six rounds: a speed-up with its 95% interval; each row's counts agree with each
    other (α_j n_j integral, Σ_j α_j n_j = AL × steps, pooled α = Σ accepted / Σ reached,
    steps = verifier calls at batch 1)."""
    output = tmp_path / "d.json"
    assert cli.main(bench_args(checkpoints, output, "-k", "3", "--repeats", "6")) == 0
    out = capsys.readouterr().out
    assert "no speed-up given" not in out and "α1" in out and " v " in out
    table = json.loads(output.read_text())
    assert "speedup_note" not in table
    baseline, *rows = table["rows"]
    assert baseline["speedup"] == 1.0 and "speedup_low" not in baseline  # not a measurement
    assert baseline["steps"] == 0 and baseline["alpha_by_position"] == []
    for row in rows:
        assert row["speedup_low"] <= row["speedup"] <= row["speedup_high"]
        assert row["speedup_coverage"] == 1 - 2 / 64
        assert f"{row['speedup']:.2f}x [{row['speedup_low']:.2f}, " in out
        reached, alphas = row["reached_by_position"], row["alpha_by_position"]
        assert len(reached) == len(alphas) == 3
        taken = [round(a * n) if n else 0 for a, n in zip(alphas, reached, strict=True)]
        for alpha, n, count in zip(alphas, reached, taken, strict=True):
            assert (alpha is None) == (n == 0)
            assert n == 0 or alpha * n == pytest.approx(count, abs=1e-9)
        assert row["steps"] == row["verifier_calls"] >= reached[0] > 0  # batch 1
        assert sum(taken) == round(row["acceptance_length"] * row["steps"])
        assert row["alpha"] == pytest.approx(sum(taken) / sum(reached), rel=1e-12)
        assert row["verify_cost"] > 0 and row["cost_ratio"] > 0


def test_bench_decode_across_batch_sizes(checkpoints, capsys, tmp_path):
    """--batch-sizes 1 2: every config at both sizes, each against its own baseline, and
    over batch 1's; the batch-1 baseline is the reference (1 by definition)."""
    output = tmp_path / "b.json"
    args = bench_args(checkpoints, output, "-k", "2", "--repeats", "6", "--batch-sizes", "1", "2")
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "batches 1 2" in out and "vs b1" in out
    table = json.loads(output.read_text())
    rows = table["rows"]
    assert [(row["label"], row["batch_size"]) for row in rows] == [
        (label, size) for size in (1, 2) for label in ("autoregressive", "sps", "cactus(δ=1.0)")
    ]
    assert table["reference_batch_size"] == 1
    assert rows[0]["speedup_over_reference"] == rows[3]["speedup"] == 1.0
    for row in rows[1:3] + rows[4:]:
        assert row["speedup_over_reference_low"] <= row["speedup_over_reference"]
        assert row["speedup_over_reference"] <= row["speedup_over_reference_high"]
    assert rows[1]["speedup"] == rows[1]["speedup_over_reference"]  # batch 1: one baseline
    for row in rows[4:]:  # three prompts at batch 2: a pair, then one alone
        assert row["steps"] >= row["verifier_calls"]
    assert cli.main([*args[:-2], "2", "0"]) == 2
    assert "batch_sizes: every batch size must be >= 1" in capsys.readouterr().err
    assert cli.main([*args[:-2], "2", "2"]) == 2
    assert "batch_sizes: given twice in (2, 2)" in capsys.readouterr().err
