"""The report's real-model section: the exact acceptance–divergence trade-off on real
contexts of the default pair, then the paper's decoding table.

``run(out, quick)`` loads the default pair (``cactus_theory.real.smollm``:
SmolLM2-135M-Instruct and its shipped feature draft), bfloat16 on one CPU thread, and for
each evaluation set of ``DATASETS`` (``cactus_theory.real.datasets``: MT-Bench's first
turns, HumanEval, the held-out prompts), after measuring the pair's draft cost c and
verify costs v_k once (``speed_costs``: ``real.costs.measure_costs`` on the first set's
prompts, cached under ``out/real-model``; if they cannot be measured the predicted
speed-ups are left out and ``costs_unavailable`` says why):

1. builds the set's pool (``real.pools.build_pool`` with ``POOL``: at least 2,000
   positions of the verifier's own sampled continuations, teacher-forced; ``--quick``:
   MT-Bench only, ``QUICK_POOL``), cached per shard under ``out/real-model/pools``, so a
   rerun reads it back and an interrupted run resumes;
2. computes the exact trade-off of ``tradeoff.default_rules()`` on it (``real.tradeoff``:
   acceptance, KL and TV of the emitted law per token, the frontier at each rule's KL,
   predicted AL and speed-up (AL_k + 1)/(k c + v_k) for k = 1..``K_MAX``) and checks
   that the frontier dominates every rule (``tradeoff.dominance_violations``, recorded,
   never assumed; at an infinite KL the frontier accepts every draft);
3. writes the trade-off as ``out/real-tradeoff-<set>.csv``.

Then the decoding table (``real.decode_table``: autoregressive and the paper's rules,
decoded) on the sets of ``TABLE_DATASETS`` (the first set when none is among them),
cached per row and round under ``out/real-model/``. The report runs it in
``TABLE.repeats`` round(s) only, so it has no honest speed-up interval (that needs at
least ``HONEST_ROUNDS`` interleaved rounds; ``cactus bench decode`` runs them): the page
shows its AL, α and KL and leaves its timings out (``honest_speedup``, ``honest_table``).

Last, the theory against the decoder (``real.theory``) on the sets of ``THEORY_DATASETS``:
``THEORY_RULES`` decoded at k = 3 on the set's first prompts (cached per batch under
``out/real-model/theory``), each step's acceptance at draft position 1 against the pool's
exact α on the same prompts and positions (``theory.restrict``), with the reasons they
differ (selection of step starts, trajectory shift, deeper draft positions).

Everything goes to ``out/real_model.json``::

    {"pair": {...}, "device", "dtype", "threads", "pool_settings": {...},
     "costs": Costs.as_json() or null,
     "tradeoff": {set: {"document": tradeoff.to_json(...), "pool": describe line,
                        "pool_info": {...}, "violations": [...],
                        "seconds": {"pool", "tradeoff"}, "csv": file name}},
     "datasets": {set: decoding table},
     "theory": {set: {"settings": {...}, "rows": [theory.compare(...)],
                      "decoded_seconds": decoding time this run (0: read back)}},
     "timings": {...}}

When the pair or torch cannot be had (no torch, no package index), the JSON is
``{"unavailable": reason}`` and the report shows that reason; a failure of the decoding
table alone leaves the trade-off in place, with ``"table_unavailable": reason`` (the theory
check: ``"theory_unavailable"``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from cactus_theory.core.processors import PAPER_SETTING
from cactus_theory.real.decode_table import PAPER_RULES, TableSettings
from cactus_theory.real.pools import PoolSettings, RealPool
from cactus_theory.real.theory import TheorySettings
from cactus_theory.util.files import atomic_write_json, atomic_write_text

OUTPUT = "real_model.json"
#: The evaluation sets of the full report, in order (the first one is figure 8's).
DATASETS = ("mt-bench", "humaneval", "heldout")
QUICK_DATASETS = ("mt-bench",)
#: The pools: at least 2,000 positions per set (shards of 8 prompts x 128 new tokens in
#: the paper's sampling setting); --quick: 400 positions of MT-Bench.
POOL = PoolSettings(
    positions=2000, num_prompts=80, max_new_tokens=128, sampling=PAPER_SETTING, batch_size=8
)
QUICK_POOL = PoolSettings(
    positions=400, num_prompts=8, max_new_tokens=128, sampling=PAPER_SETTING, batch_size=4
)
#: How the draft cost c and the verify costs v_k (``real.costs.measure_costs``, once per
#: run, on the first set's prompts) are measured for the predicted speed-ups.
COSTS = {"num_prompts": 2, "max_new_tokens": 24, "rounds": 3}
QUICK_COSTS = {"num_prompts": 1, "max_new_tokens": 16, "rounds": 1}
#: Predicted AL for k = 1..K_MAX; the page's table shows k = SHOWN_K.
K_MAX = 5
SHOWN_K = 3
#: A measured speed-up is shown only with at least this many interleaved rounds, the
#: fewest for which the median's order-statistic interval has 95% coverage.
HONEST_ROUNDS = 6
#: The decoding table of the full report: the paper's rules at k = 3 on few prompts and
#: tokens in one round (its AL, α and KL; no speed-up: see the module docstring), on the
#: first set only (about 20 s on one core; the pools take about 50 s per set).
TABLE_DATASETS = ("mt-bench",)
TABLE = TableSettings(rules=PAPER_RULES, ks=(3,), num_prompts=2, max_new_tokens=32, repeats=1)
QUICK_TABLE = TableSettings(
    rules=("sps", "cactus:delta=1.0", "frontier:delta=1.0"),
    ks=(3,),
    num_prompts=2,
    max_new_tokens=24,
    repeats=1,
)
#: The theory against the decoder (``real.theory``) on every set: these rules decoded at
#: k = 3 on the set's first 8 prompts x 64 tokens, against the exact α of its pool on the
#: same prompts' first 64 positions (``theory.restrict``).
THEORY_DATASETS = DATASETS
THEORY_RULES = ("sps", "cactus:delta=1.0", "cactus-exact:delta=1.0")
THEORY = TheorySettings(k=3, num_prompts=8, max_new_tokens=64, sampling=PAPER_SETTING)
QUICK_THEORY = TheorySettings(
    k=3, num_prompts=4, max_new_tokens=32, sampling=PAPER_SETTING, batch_size=4
)
#: Weights dtype and CPU threads of the report's run (bfloat16 verifies k+1 tokens for
#: about the cost of one on CPUs with bf16 matrix units; one thread is robust on a
#: shared machine).
DTYPE = "bfloat16"
THREADS = 1
DEVICE = "cpu"


def run(
    out: Path,
    *,
    quick: bool,
    progress: bool = True,
    pair=None,
    say=print,
    datasets: tuple[str, ...] | None = None,
    pool_settings: PoolSettings | None = None,
    table_settings: TableSettings | None = None,
    theory_settings: TheorySettings | None = None,
    prompts: dict[str, list[str]] | None = None,
    costs: dict | None = None,
) -> dict:
    """The section's results as a dict (also written to ``out/real_model.json``; module
    docstring); ``{"unavailable": reason}`` when the pair or torch is missing.

    ``pair`` (a ``decode.runs.Pair``), ``datasets``, ``pool_settings``,
    ``table_settings``, ``theory_settings``, ``prompts`` ({set: prompts}, instead of
    ``real.datasets.prompts``) and ``costs`` (``measure_costs``'s settings) override the
    defaults (tests use a tiny pair)."""
    out = Path(out)
    names = datasets or (QUICK_DATASETS if quick else DATASETS)
    settings = SectionSettings(
        pool=pool_settings or (QUICK_POOL if quick else POOL),
        table=table_settings or (QUICK_TABLE if quick else TABLE),
        theory=theory_settings or (QUICK_THEORY if quick else THEORY),
        costs=costs or (QUICK_COSTS if quick else COSTS),
    )
    try:
        import torch
    except ImportError as error:
        return _unavailable(out, error, say)
    previous = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        result = _run(out, names, settings, prompts, pair, progress, say)
    except (ImportError, ValueError, OSError) as error:
        return _unavailable(out, error, say)
    finally:
        torch.set_num_threads(previous)
    atomic_write_json(out / OUTPUT, result, indent=1)
    return result


@dataclasses.dataclass(frozen=True)
class SectionSettings:
    """What the section runs: the pools, the decoding table, the theory comparison and the
    cost measurement (``measure_costs``'s keyword arguments)."""

    pool: PoolSettings
    table: TableSettings
    theory: TheorySettings
    costs: dict


def _unavailable(out: Path, error: Exception, say) -> dict:
    result = {"unavailable": f"{type(error).__name__}: {error}"}
    say(f"real-model section unavailable: {result['unavailable']}")
    atomic_write_json(out / OUTPUT, result, indent=1)
    return result


def _run(out, names, settings: SectionSettings, prompts, pair, progress, say):
    import torch

    from cactus_theory.decode.runs import load_setup
    from cactus_theory.real import datasets, smollm

    timings: dict[str, float] = {}
    mark = time.perf_counter()
    chosen = pair or smollm.ensure_pair(say)
    setup = load_setup(chosen, torch.device(DEVICE), DTYPE)
    timings["load"] = time.perf_counter() - mark
    texts = {name: (prompts or {}).get(name) or datasets.prompts(name) for name in names}
    mark = time.perf_counter()
    setup.prompts = list(texts[names[0]])
    measured, costs_reason = None, None
    try:
        measured = speed_costs(out, setup, settings.costs, say)
    except (ValueError, RuntimeError) as error:
        costs_reason = f"{type(error).__name__}: {error}"
        say(f"real-model costs unavailable (no predicted speed-up): {costs_reason}")
    timings["costs"] = time.perf_counter() - mark
    trade, built = {}, {}
    for name in names:
        setup.prompts = list(texts[name])
        trade[name], built[name] = dataset_tradeoff(
            out, setup, name, settings.pool, measured, progress
        )
    timings["pools"] = sum(entry["seconds"]["pool"] for entry in trade.values())
    timings["tradeoff"] = sum(entry["seconds"]["tradeoff"] for entry in trade.values())
    result = {
        "pair": {"name": chosen.name, "verifier": chosen.verifier, "draft": chosen.draft},
        "device": DEVICE,
        "dtype": DTYPE,
        "threads": THREADS,
        "pool_settings": pool_fields(settings.pool),
        "costs": None if measured is None else measured.as_json(),
        "tradeoff": trade,
    }
    if costs_reason:
        result["costs_unavailable"] = costs_reason
    mark = time.perf_counter()
    try:
        table_names = [name for name in names if name in TABLE_DATASETS] or list(names[:1])
        result["datasets"] = decoding_tables(
            out, setup, table_names, texts, settings.table, progress
        )
    except (ValueError, OSError, RuntimeError) as error:
        result["table_unavailable"] = f"{type(error).__name__}: {error}"
        say(f"real-model decoding table unavailable: {result['table_unavailable']}")
    timings["decode_table"] = time.perf_counter() - mark
    mark = time.perf_counter()
    try:
        theory_names = [name for name in names if name in THEORY_DATASETS] or list(names[:1])
        result["theory"] = theory_tables(
            out,
            setup,
            {name: built[name] for name in theory_names},
            texts,
            settings.theory,
            progress,
        )
    except (ValueError, OSError, RuntimeError) as error:
        result["theory_unavailable"] = f"{type(error).__name__}: {error}"
        say(f"real-model theory check unavailable: {result['theory_unavailable']}")
    timings["theory"] = time.perf_counter() - mark
    result["timings"] = timings
    return result


def theory_tables(
    out: Path, setup, built: dict[str, RealPool], texts, settings: TheorySettings, progress
) -> dict:
    """{set: the theory against the decoder (``real.theory.compare`` of each of
    ``THEORY_RULES``)}: the set's first ``settings.num_prompts`` prompts decoded with each
    rule (cached per batch under ``out/real-model/theory``), against the exact acceptance of
    the set's pool ``built[set]`` on the same prompts' first ``settings.max_new_tokens``
    positions (``theory.restrict``)."""
    from cactus_theory.real import theory

    tables = {}
    for name, pool in built.items():
        compared = dataclasses.replace(
            settings, num_prompts=min(settings.num_prompts, int(pool.prompt.max()) + 1)
        )
        subset = theory.restrict(pool, compared)
        setup.prompts = list(texts[name])
        rows, seconds = [], 0.0
        for rule in THEORY_RULES:
            decoded = theory.decode(
                setup,
                compared,
                rule,
                out / "real-model" / "theory",
                device=DEVICE,
                dtype=DTYPE,
                progress=progress,
            )
            seconds += sum(decoded.info["seconds"])
            row = theory.compare(subset, decoded, rule, compared.k, compared.max_new_tokens)
            rows.append({key: _strict(value) for key, value in row.items()})
        tables[name] = {
            "settings": {**dataclasses.asdict(compared), "sampling": compared.sampling.label},
            "rows": rows,
            "decoded_seconds": seconds,
        }
    return tables


def _strict(value):
    """A JSON value with NaN and infinities as null (a standard error of one prompt is NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_strict(item) for item in value]
    return value


def pool_fields(settings: PoolSettings) -> dict:
    """The pool settings as JSON (the sampling setting as its fields and label)."""
    fields = dataclasses.asdict(settings)
    fields["sampling"] = {**dataclasses.asdict(settings.sampling), "label": settings.sampling.label}
    return fields


def speed_costs(out: Path, setup, settings: dict, say):
    """``real.costs.Costs`` of the pair for k = 1..``K_MAX``, measured once with the
    decoder (``measure_costs`` with ``settings``) and cached as JSON under
    ``out/real-model``, keyed by the pair, the prompts, the settings, the device, dtype
    and threads (a rerun reads it back)."""
    import json

    from cactus_theory.real import costs
    from cactus_theory.real.decode_table import pair_identity
    from cactus_theory.util import provenance

    key = provenance.fingerprint(
        "costs",
        pair_identity(setup),
        setup.prompts[: settings["num_prompts"]],
        settings,
        K_MAX,
        DEVICE,
        DTYPE,
        THREADS,
    )
    path = out / "real-model" / f"costs-{key}.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return costs.Costs(
                draft_cost=data["draft_cost"],
                verify_costs={int(k): v for k, v in data["verify_costs"].items()},
                step_seconds=data["step_seconds"],
                settings=data["settings"],
            )
        except (OSError, ValueError, KeyError, TypeError):
            pass  # damaged: measured again
    measured = costs.measure_costs(setup, range(1, K_MAX + 1), progress=say, **settings)
    atomic_write_json(path, measured.as_json(), indent=1)
    return measured


def dataset_tradeoff(
    out: Path, setup, name: str, settings: PoolSettings, measured, progress: bool
) -> tuple[dict, RealPool]:
    """One set's exact trade-off (module docstring, steps 1-3) as JSON, with predicted
    speed-ups when the costs were ``measured`` (a ``real.costs.Costs``), and its pool."""
    from cactus_theory.real import pools, tradeoff

    mark = time.perf_counter()
    pool = pools.build_pool(
        setup,
        settings,
        out / "real-model" / "pools",
        device=DEVICE,
        dtype=DTYPE,
        progress=progress,
        name=name,
    )
    pool_seconds = time.perf_counter() - mark
    mark = time.perf_counter()
    found = tradeoff.tradeoff(
        pool,
        tradeoff.default_rules(),
        k_max=K_MAX,
        draft_cost=None if measured is None else measured.draft_cost,
        verify_costs=None if measured is None else measured.verify_costs,
    )
    violations = tradeoff.dominance_violations(found)
    document = tradeoff.to_json(
        found,
        pair={"name": setup.pair.name, "verifier": setup.pair.verifier, "draft": setup.pair.draft},
        settings={**pool_fields(settings), "dataset": name, "device": DEVICE, "dtype": DTYPE},
    )
    tradeoff_seconds = time.perf_counter() - mark
    csv_name = f"real-tradeoff-{name}.csv"
    atomic_write_text(out / csv_name, tradeoff.csv_text(document))
    info = {key: value for key, value in pool.info.items() if key != "folder"}
    return {
        "document": document,
        "pool": pools.describe(pool),
        "pool_info": info,
        "violations": violations,
        "seconds": {"pool": pool_seconds, "tradeoff": tradeoff_seconds},
        "csv": csv_name,
    }, pool


def decoding_tables(out: Path, setup, names, texts, settings: TableSettings, progress) -> dict:
    """{set: the decoding table (``real.decode_table.run``) on its first prompts}."""
    from cactus_theory.real import decode_table

    tables = {}
    for name in names:
        setup.prompts = list(texts[name])[: settings.num_prompts]
        table = decode_table.run(
            setup,
            settings,
            out / "real-model",
            device=DEVICE,
            dtype=DTYPE,
            threads=THREADS,
            progress=progress,
        )
        table["dtype"], table["threads"], table["dataset"] = DTYPE, THREADS, name
        tables[name] = honest_table(table)
    return tables


#: A decoding-table row's measured speed-up fields (cleared when not honest).
SPEEDUP_FIELDS = ("speedup", "speedup_low", "speedup_high", "speedup_coverage")


def honest_table(table: dict) -> dict:
    """``table`` with every speed-up that has no honest interval (``honest_speedup``)
    cleared to None and the reason recorded as ``speedup_left_out``, so neither the page
    nor ``real_model.json`` carries a degenerate interval."""
    rounds = table_rounds(table)
    rows = []
    for row in table["rows"]:
        row = dict(row)
        if row["rule"] != "autoregressive" and honest_speedup(row, rounds) is None:
            row.update(dict.fromkeys(SPEEDUP_FIELDS))
            if "measured_over_predicted" in row:
                row["measured_over_predicted"] = None
        rows.append(row)
    result = {**table, "rows": rows}
    if rounds < HONEST_ROUNDS:
        result["speedup_left_out"] = (
            f"{rounds} round(s): an honest interval for a measured speed-up needs at least "
            f"{HONEST_ROUNDS} interleaved rounds"
        )
    return result


# --- reading real_model.json --------------------------------------------------------------


def dataset_tables(real_model: dict | None) -> dict:
    """{set name: decoding table} of a ``real_model.json`` ({} when missing or unavailable)."""
    if not real_model or "unavailable" in real_model:
        return {}
    return dict(real_model.get("datasets") or {})


def tradeoff_documents(real_model: dict | None) -> dict:
    """{set name: ``tradeoff.to_json`` document} of a ``real_model.json`` ({} when missing
    or unavailable)."""
    if not real_model or "unavailable" in real_model:
        return {}
    return {name: entry["document"] for name, entry in (real_model.get("tradeoff") or {}).items()}


def table_rounds(table: dict) -> int:
    """The interleaved rounds a decoding table ran (its settings' ``repeats``)."""
    return int(table.get("settings", {}).get("repeats", 1))


def honest_speedup(row: dict, rounds: int) -> tuple[float, float, float] | None:
    """(speed-up, low, high) of a decoding-table row when it has an honest interval: at
    least ``HONEST_ROUNDS`` rounds, a speed-up and an interval whose ends differ; None
    otherwise (the speed-up is then left out, never shown as a degenerate interval)."""
    speedup, low, high = row.get("speedup"), row.get("speedup_low"), row.get("speedup_high")
    if rounds < HONEST_ROUNDS or speedup is None or low is None or high is None:
        return None
    if not low < high:
        return None
    return float(speedup), float(low), float(high)


#: z of a two-sided 95% normal interval.
Z95 = 1.959963984540054


def al_half_width(row: dict) -> float | None:
    """A 95% half-width for a decoding-table row's AL from its own counts: accepted drafts
    per step lie in [0, k], so their variance is at most AL (k − AL) (Bhatia–Davis), and
    over n verify steps (tokens / tokens per call; steps treated as independent) the
    half-width is at most z·√(AL (k − AL)/n). None without the counts."""
    import math

    tokens, per_call, k = row.get("tokens"), row.get("tokens_per_call"), row.get("k")
    if not tokens or not per_call or not k:
        return None
    al = row["acceptance_length"]
    return Z95 * math.sqrt(max(al * (k - al), 0.0) / (tokens / per_call))


def find_row(document: dict, spec: str) -> dict | None:
    """The row of ``document`` whose rule is ``spec`` (``real.tradeoff.find_row``)."""
    from cactus_theory.real.tradeoff import find_row as find

    return find(document, spec)


# --- as a child process of `cactus report` ------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m cactus_theory.real.real_model --out DIR [--quick] [--no-progress]``:
    ``run`` in its own process (``paper_figs.report`` starts it beside the sweep once the
    claims check is done, so it takes the core the claims check freed)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m cactus_theory.real.real_model",
        description="The report's real-model section, written to DIR/real_model.json.",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="the report's folder")
    parser.add_argument("--quick", action="store_true", help="the report's quick mode")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = parser.parse_args(argv)
    found = run(Path(args.out), quick=args.quick, progress=not args.no_progress)
    return 0 if "unavailable" not in found else 3


if __name__ == "__main__":
    import sys

    from cactus_theory.util.process import exit_with_parent

    exit_with_parent()  # a child of `cactus report` must not outlive it
    sys.exit(main())
