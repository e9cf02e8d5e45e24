"""The report's real-model section: the exact acceptance–divergence trade-off on real
contexts of the default pair, the theory against the decoder, and the predicted speed-up
against a measured one.

``run(out, quick)`` loads the default pair (``cactus_theory.real.smollm``:
SmolLM2-135M-Instruct and its shipped feature draft) and works in stages, each printing
a line per unit of work with its progress and time left (``util.stages.StageLog``):

1. **dtypes**: the dtype measured fastest on this CPU (``real.precision``, cached per
   machine) for the pools' work (a generation step at the pool's batch size) and for the
   decoder's (a verify call of k + 1 tokens at batch 1): float32 on CPUs without
   bfloat16 units, where bfloat16 is slower;
2. **pools**: for each evaluation set of ``DATASETS`` (``real.datasets``: MT-Bench's first
   turns, HumanEval, the held-out prompts) a pool of at least ``POOL.positions`` = 2,000
   positions of the verifier's own sampled continuations, teacher-forced
   (``real.pools.build_pool``; ``--quick``: MT-Bench only, ``QUICK_POOL``), cached per
   shard under ``out/real-model/pools``, and its exact trade-off (``real.tradeoff``:
   acceptance, KL and TV of the emitted law per token, the frontier at each rule's KL,
   dominance checked, never assumed), written as ``out/real-tradeoff-<set>.csv``;
3. **trees**: on the first set's pool, the exact trade-off of tree rules
   (``real.tree_tradeoff``): one node of K = 1, 2, 4 children at every position, the
   draft's top-K (every default tree rule: the walk, Cactus-tree over δ, SGLang's
   thresholds, Medusa's typical acceptance) and K sampled children with replacement
   (RRS, SpecTr's K-SEQ, the optimum, Cactus-RRS δ = 1), each beside the tree frontier
   (dominance checked), written as ``out/real-tree-tradeoff-<set>.csv``;
4. **theory**: on every set, ``THEORY_RULES`` decoded at k = 3 on the set's first prompts
   (``real.theory``, cached per batch), each rule's pool α on the same prompts and
   positions against the decoder's measured α₁ with standard errors by prompt, and the
   reasons they differ;
5. **speed**: once the machine is quiet (the report's other processes have finished:
   ``CoreShare.wait_quiet``), on one thread in the decoder's dtype, the predicted
   speed-up against a measured one for SpS and Cactus δ = 1 at k = 3 on the first set's
   first prompts (``real.speed_check``: 6 interleaved rounds, a new sample each round,
   costs c and v with intervals, the measured speed-up with its interval, and why they
   differ); its costs then give every rule's predicted speed-up at k = 3 in the trade-off
   tables (no other k: only v_3 is measured).

Cores: the report starts this section at once, beside its sweep and claims check, and
grants it cores through a ``CoreShare`` file (``--cores-file``): one while the others
run, two once they are done; each shard, decode and round reads the grant. Alone, it uses
every core. The pools do not depend on the thread count (float summation order in
torch's CPU kernels is per output element), so they are deterministic given (pair,
prompts, settings, dtype).

Everything goes to ``out/real_model.json``::

    {"pair": {...}, "device", "dtype", "dtype_choices": {"pools", "decoder"}, "cpu": {...},
     "pool_settings": {...},
     "tradeoff": {set: {"document": tradeoff.to_json(...), "pool": describe line,
                        "pool_info": {...}, "violations": [...],
                        "seconds": {"pool", "tradeoff"}, "csv": file name}},
     "trees": {"dataset", "document": tree_tradeoff.to_json(...), "csv", "seconds"},
     "theory": {set: {"settings": {...}, "rows": [theory.compare(...)],
                      "decoded_seconds": decoding time this run (0: read back)}},
     "speed": speed_check.summarise(...) with "dataset", "dtype", "threads",
     "costs": the speed check's costs (c, v, o, T with intervals), "timings": {...}}

When the pair or torch cannot be had (no torch, no package index), the JSON is
``{"unavailable": reason}`` and the report shows that reason; a failure of the theory
check, the tree trade-off or the speed check alone leaves the rest in place, with
``"theory_unavailable"``, ``"trees_unavailable"`` or ``"speed_unavailable"``: the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path

from cactus_theory.core.processors import PAPER_SETTING
from cactus_theory.real.pools import PoolSettings, RealPool
from cactus_theory.real.speed_check import SpeedSettings
from cactus_theory.real.theory_decode import TheorySettings
from cactus_theory.util.files import atomic_write_json, atomic_write_text
from cactus_theory.util.stages import CoreShare, StageLog

OUTPUT = "real_model.json"
#: The evaluation sets of the full report, in order (the first is the speed check's).
DATASETS = ("mt-bench", "humaneval", "heldout")
QUICK_DATASETS = ("mt-bench",)
#: The pools: at least 2,000 positions per set (shards of up to 16 prompts x 128 new tokens
#: in the paper's sampling setting: at batch 16 a generation step costs 7.6 ms per row on
#: one AVX2 thread in float32, against 11.3 at batch 8); --quick: 400 positions of MT-Bench.
POOL = PoolSettings(
    positions=2000, num_prompts=80, max_new_tokens=128, sampling=PAPER_SETTING, batch_size=16
)
QUICK_POOL = PoolSettings(
    positions=400, num_prompts=8, max_new_tokens=128, sampling=PAPER_SETTING, batch_size=4
)
#: Predicted AL for k = 1..K_MAX; the speed check (and so the predicted speed-ups) at k =
#: SHOWN_K.
K_MAX = 5
SHOWN_K = 3
#: The theory against the decoder on every set: these rules decoded at k = 3 on the set's
#: first 8 prompts x 64 tokens, against the exact α of its pool on the same prompts' first
#: 64 positions (``theory.restrict``). The lossless rule and the headline lossy one (the
#: rules the speed check times); ``cactus bench theory --rule`` runs any other.
THEORY_DATASETS = DATASETS
THEORY_RULES = ("sps", "cactus:delta=1.0")
THEORY = TheorySettings(k=SHOWN_K, num_prompts=8, max_new_tokens=64, sampling=PAPER_SETTING)
QUICK_THEORY = TheorySettings(
    k=SHOWN_K, num_prompts=4, max_new_tokens=32, sampling=PAPER_SETTING, batch_size=4
)
#: The tree trade-off on the first set's pool: node widths, and the rules of sampled
#: children (closed forms, and Cactus-RRS at δ = 1 by enumeration); the draft's top-K
#: children get every default tree rule (``real.tree_tradeoff.default_tree_rules``).
TREE_WIDTHS = (1, 2, 4)
TREE_SAMPLED_RULES = ("rrs", "k-seq", "optimal", "cactus-rrs:delta=1")
#: The predicted against the measured speed-up (``real.speed_check``) on the first set.
SPEED = SpeedSettings(k=SHOWN_K, num_prompts=3, max_new_tokens=48, sampling=PAPER_SETTING)
QUICK_SPEED = SpeedSettings(k=SHOWN_K, num_prompts=1, max_new_tokens=24, sampling=PAPER_SETTING)
#: The speed check's CPU threads (the decoder's setting of the README's table; the other
#: core stays idle, so the timings are a quiet machine's).
SPEED_THREADS = 1
DEVICE = "cpu"


@dataclasses.dataclass(frozen=True)
class SectionSettings:
    """What the section runs: the pools, the theory comparison and the speed check."""

    pool: PoolSettings
    theory: TheorySettings
    speed: SpeedSettings


def run(
    out: Path,
    *,
    quick: bool,
    progress: bool = True,
    pair=None,
    say=None,
    datasets: tuple[str, ...] | None = None,
    pool_settings: PoolSettings | None = None,
    theory_settings: TheorySettings | None = None,
    speed_settings: SpeedSettings | None = None,
    prompts: dict[str, list[str]] | None = None,
    cores: CoreShare | None = None,
    dtypes: dict[str, str] | None = None,
) -> dict:
    """The section's results as a dict (also written to ``out/real_model.json``; module
    docstring); ``{"unavailable": reason}`` when the pair or torch is missing.

    ``pair`` (a ``decode.runs.Pair``), ``datasets``, ``pool_settings``,
    ``theory_settings``, ``speed_settings``, ``prompts`` ({set: prompts}, instead of
    ``real.datasets.prompts``) and ``dtypes`` ({"pools": ..., "decoder": ...}, instead of
    measuring them) override the defaults (tests use a tiny pair); ``cores`` is the
    parent's grant (None: alone, every core, quiet); ``say`` prints a progress line
    (default: print, flushed)."""
    out = Path(out)
    names = datasets or (QUICK_DATASETS if quick else DATASETS)
    settings = SectionSettings(
        pool=pool_settings or (QUICK_POOL if quick else POOL),
        theory=theory_settings or (QUICK_THEORY if quick else THEORY),
        speed=speed_settings or (QUICK_SPEED if quick else SPEED),
    )
    log = StageLog("real-model", say=say)
    try:
        import torch
    except ImportError as error:
        return _unavailable(out, error, log)
    previous = torch.get_num_threads()
    stop_heartbeat = log.heartbeat()
    try:
        section = Section(out, settings, cores or CoreShare(None), log, progress)
        result = section.run(names, prompts, pair, dtypes)
    except (ImportError, ValueError, OSError) as error:
        return _unavailable(out, error, log)
    finally:
        stop_heartbeat()
        torch.set_num_threads(previous)
    atomic_write_json(out / OUTPUT, result, indent=1)
    return result


def _unavailable(out: Path, error: Exception, log: StageLog) -> dict:
    result = {"unavailable": f"{type(error).__name__}: {error}"}
    log.line(f"real-model section unavailable: {result['unavailable']}")
    atomic_write_json(out / OUTPUT, result, indent=1)
    return result


class Section:
    """The stages of ``run`` (module docstring), sharing the pair, the pools and a log."""

    def __init__(self, out: Path, settings: SectionSettings, cores: CoreShare, log, progress):
        self.out, self.settings, self.cores, self.log = out, settings, cores, log
        self.progress = progress
        self.cache = out / "real-model"
        self.timings: dict[str, float] = {}

    def use_cores(self) -> int:
        """Set torch's threads to the cores granted now; the count."""
        import torch

        threads = self.cores.threads()
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return threads

    def run(self, names, prompts, pair, dtypes: dict[str, str] | None = None) -> dict:
        from cactus_theory.real import datasets, precision, smollm

        self.use_cores()
        stage = self.log.stage("load and dtypes")
        chosen = pair or smollm.ensure_pair(lambda text: self.log.line(f"load: {text}"))
        choices = dtypes_for(chosen.verifier, self.settings, dtypes)
        for role, choice in choices.items():
            self.log.line(f"load: {role}: {choice.describe()}")
        texts = {name: (prompts or {}).get(name) or datasets.prompts(name) for name in names}
        setup = self.load(chosen, choices["pools"].dtype)
        self.pair = {"name": chosen.name, "verifier": chosen.verifier, "draft": chosen.draft}
        self.dtype = choices["pools"].dtype
        self.timings["load"] = stage.finish()
        trade, built = {}, {}
        for name in names:
            setup.prompts = list(texts[name])
            trade[name], built[name] = self.pool_tradeoff(setup, name)
        self.timings["pools"] = sum(entry["seconds"]["pool"] for entry in trade.values())
        result = {
            "pair": self.pair,
            "device": DEVICE,
            "dtype": self.dtype,
            "dtype_choices": {role: choice.describe() for role, choice in choices.items()},
            "cpu": precision.cpu_identity(),
            "pool_settings": pool_fields(self.settings.pool),
            "tradeoff": trade,
        }
        with self.optional_stage("trees", result):
            result["trees"] = self.trees(built[names[0]], names[0])
        with self.optional_stage("theory", result):
            theory_names = [name for name in names if name in THEORY_DATASETS] or list(names[:1])
            result["theory"] = self.theory(
                setup, {name: built[name] for name in theory_names}, texts
            )
        with self.optional_stage("speed", result):
            first = names[0]
            setup.prompts = list(texts[first])
            speed = self.speed(chosen, setup, choices["decoder"].dtype, trade[first])
            result["speed"] = {**speed, "dataset": first}
            result["costs"] = speed["costs"]
            self.predicted_speedups(trade, built, speed["costs"])
        result["timings"] = self.timings
        return result

    @contextlib.contextmanager
    def optional_stage(self, name: str, result: dict):
        """Run a stage that the section can do without: its time goes to ``timings[name]``;
        a ValueError, OSError or RuntimeError becomes ``result[name + "_unavailable"]``
        (and a progress line) instead of ending the section."""
        mark = time.perf_counter()
        try:
            yield
        except (ValueError, OSError, RuntimeError) as error:
            result[f"{name}_unavailable"] = f"{type(error).__name__}: {error}"
            self.log.line(f"{name}: unavailable: {result[f'{name}_unavailable']}")
        self.timings[name] = time.perf_counter() - mark

    def load(self, pair, dtype: str):
        import torch

        from cactus_theory.decode.runs import load_setup

        return load_setup(pair, torch.device(DEVICE), dtype)

    # -- pools and their exact trade-off ----------------------------------------------------

    def pool_tradeoff(self, setup, name: str) -> tuple[dict, RealPool]:
        """One set's pool and exact trade-off (module docstring, stage 2) as JSON, without
        predicted speed-ups (``predicted_speedups`` adds them once the costs are known)."""
        from cactus_theory.real import pools

        settings = self.settings.pool
        stage = self.log.stage(f"pool {name}", settings.positions, "positions")

        def on_shard(shards: int, positions: int, fresh: bool) -> None:
            threads = self.use_cores()
            how = "built" if fresh else "read from the cache"
            stage.update(
                min(positions, settings.positions),
                f"shard {shards} {how} ({threads} thread{'s' * (threads > 1)})",
            )

        mark = time.perf_counter()
        pool = pools.build_pool(
            setup,
            settings,
            self.cache / "pools",
            device=DEVICE,
            dtype=self.dtype,
            progress=self.progress,
            name=name,
            on_shard=on_shard,
        )
        pool_seconds = time.perf_counter() - mark
        stage.finish(pools.describe(pool))
        mark = time.perf_counter()
        entry = {
            "pool": pools.describe(pool),
            "pool_info": {key: value for key, value in pool.info.items() if key != "folder"},
            "csv": f"real-tradeoff-{name}.csv",
        }
        self.write_tradeoff(entry, pool, name, None)
        entry["seconds"] = {"pool": pool_seconds, "tradeoff": time.perf_counter() - mark}
        return entry, pool

    def write_tradeoff(self, entry: dict, pool: RealPool, name: str, costs) -> None:
        """The set's exact trade-off into ``entry`` (document, violations) and its CSV;
        with ``costs`` (the speed check's) the predicted speed-ups at ``SHOWN_K``."""
        from cactus_theory.real import tradeoff

        found = tradeoff.tradeoff(
            pool,
            tradeoff.default_rules(),
            k_max=K_MAX,
            draft_cost=None if costs is None else costs["draft_cost"]["median"],
            verify_costs=None
            if costs is None
            else {self.settings.speed.k: costs["verify_cost"]["median"]},
        )
        entry["violations"] = tradeoff.dominance_violations(found)
        entry["document"] = tradeoff.to_json(
            found,
            pair=self.pair,
            settings={
                **pool_fields(self.settings.pool),
                "dataset": name,
                "device": DEVICE,
                "dtype": self.dtype,
            },
        )
        atomic_write_text(self.out / entry["csv"], tradeoff.csv_text(entry["document"]))

    def predicted_speedups(self, trade: dict, built: dict, costs: dict) -> None:
        """Every set's trade-off again, with the predicted speed-ups from ``costs``."""
        for name, entry in trade.items():
            self.write_tradeoff(entry, built[name], name, costs)

    # -- tree rules on the same pool ---------------------------------------------------------

    def trees(self, pool: RealPool, name: str) -> dict:
        """The tree trade-off on ``pool`` (module docstring, stage 3) as JSON, and its CSV."""
        from cactus_theory.core import trees
        from cactus_theory.real import tree_tradeoff

        schemes = (trees.DETERMINISTIC, trees.WITH_REPLACEMENT)
        stage = self.log.stage(f"trees {name}", len(schemes) * len(TREE_WIDTHS), "configurations")
        mark, found = time.perf_counter(), []
        for scheme in schemes:
            specs = None if scheme == trees.DETERMINISTIC else list(TREE_SAMPLED_RULES)
            for width in TREE_WIDTHS:
                self.use_cores()
                found.append(tree_tradeoff.configuration(pool, scheme, width, specs, K_MAX))
                stage.update(len(found), f"{scheme} K={width}")
        document = tree_tradeoff.to_json(found, dataset=name, positions=len(pool), pair=self.pair)
        csv_name = f"real-tree-tradeoff-{name}.csv"
        atomic_write_text(self.out / csv_name, tree_tradeoff.csv_text(document))
        violations = len(document["violations"])
        stage.finish(f"{violations} dominance violation{'s' * (violations != 1)}")
        return {
            "dataset": name,
            "document": document,
            "csv": csv_name,
            "seconds": time.perf_counter() - mark,
        }

    # -- the theory against the decoder -----------------------------------------------------

    def theory(self, setup, built: dict[str, RealPool], texts) -> dict:
        """{set: the theory against the decoder (``real.theory.compare`` of each of
        ``THEORY_RULES``)} (module docstring, stage 3)."""
        from cactus_theory.real import theory

        settings = self.settings.theory
        stage = self.log.stage("theory", len(built) * len(THEORY_RULES), "decodes")
        tables, done = {}, 0
        for name, pool in built.items():
            compared = dataclasses.replace(
                settings, num_prompts=min(settings.num_prompts, int(pool.prompt.max()) + 1)
            )
            subset = theory.restrict(pool, compared)
            setup.prompts = list(texts[name])
            rows, seconds = [], 0.0
            for rule in THEORY_RULES:
                threads = self.use_cores()
                decoded = theory.decode(
                    setup,
                    compared,
                    rule,
                    self.cache / "theory",
                    device=DEVICE,
                    dtype=self.dtype,
                    progress=self.progress,
                )
                seconds += sum(decoded.info["seconds"])
                row = theory.compare(subset, decoded, rule, compared.k, compared.max_new_tokens)
                rows.append({key: _strict(value) for key, value in row.items()})
                done += 1
                stage.update(done, f"{name} {rule} ({threads} thread{'s' * (threads > 1)})")
            tables[name] = {
                "settings": {**dataclasses.asdict(compared), "sampling": compared.sampling.label},
                "rows": rows,
                "decoded_seconds": seconds,
            }
        stage.finish()
        return tables

    # -- the predicted speed-up against a measured one --------------------------------------

    def speed(self, pair, setup, dtype: str, entry: dict) -> dict:
        """The speed check (module docstring, stage 4) on ``setup``'s prompts, in the
        decoder's ``dtype`` on ``SPEED_THREADS`` threads of a quiet machine."""
        import torch

        from cactus_theory.real import speed_check
        from cactus_theory.real.tradeoff import find_row

        settings = self.settings.speed
        waited = self.cores.wait_quiet(self.log, "speed")
        torch.set_num_threads(SPEED_THREADS)
        prompts = setup.prompts[: settings.num_prompts]
        if dtype != self.dtype:
            setup = self.load(pair, dtype)
        setup.prompts = prompts
        alphas = {}
        for spec in settings.rules:
            row = find_row(entry["document"], spec)
            if row is not None:
                alphas[spec] = row["acceptance"]
        rounds = settings.rounds * (1 + len(settings.rules))
        stage = self.log.stage(
            f"speed ({settings.rounds} interleaved rounds, {SPEED_THREADS} thread, {dtype})",
            rounds,
            "runs",
        )
        found = speed_check.run(
            setup,
            alphas,
            settings,
            self.cache,
            device=DEVICE,
            dtype=dtype,
            threads=SPEED_THREADS,
            on_cell=lambda done, total: stage.update(done),
        )
        stage.finish()
        for row in found["rows"][1:]:
            self.log.line(f"speed: {row['label']}: {row['why']}")
        return {**found, "dtype": dtype, "threads": SPEED_THREADS, "waited_seconds": waited}


def dtypes_for(verifier: str, settings: SectionSettings, given: dict[str, str] | None) -> dict:
    """{"pools": choice, "decoder": choice} (``precision.DtypeChoice``): measured on this CPU
    (``precision.workload_dtypes``), or ``given`` ones."""
    from cactus_theory.real import precision

    if given is not None:
        return {
            role: precision.DtypeChoice(given[role], "given", tokens)
            for role, tokens in (("pools", 1), ("decoder", settings.speed.k + 1))
        }
    return precision.workload_dtypes(
        verifier,
        DEVICE,
        pool_batch_size=settings.pool.batch_size,
        verify_tokens=settings.speed.k + 1,
        threads=SPEED_THREADS,
    )


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


# --- reading real_model.json --------------------------------------------------------------


def tradeoff_documents(real_model: dict | None) -> dict:
    """{set name: ``tradeoff.to_json`` document} of a ``real_model.json`` ({} when missing
    or unavailable)."""
    if not real_model or "unavailable" in real_model:
        return {}
    return {name: entry["document"] for name, entry in (real_model.get("tradeoff") or {}).items()}


def speed_result(real_model: dict | None) -> dict:
    """The speed check of a ``real_model.json`` ({} when missing or unavailable)."""
    if not real_model or "unavailable" in real_model:
        return {}
    return dict(real_model.get("speed") or {})


def find_row(document: dict, spec: str) -> dict | None:
    """The row of ``document`` whose rule is ``spec`` (``real.tradeoff.find_row``)."""
    from cactus_theory.real.tradeoff import find_row as find

    return find(document, spec)


# --- as a child process of `cactus report` ------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m cactus_theory.real.real_model --out DIR [--quick] [--no-progress]
    [--cores-file PATH]``: ``run`` in its own process (``paper_figs.report`` starts it
    beside the sweep and the claims check, and grants it cores through PATH)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m cactus_theory.real.real_model",
        description="The report's real-model section, written to DIR/real_model.json.",
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="the report's folder")
    parser.add_argument("--quick", action="store_true", help="the report's quick mode")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument(
        "--cores-file",
        metavar="PATH",
        help="the parent's grant of cores (util.stages.CoreShare); default: alone, every core",
    )
    args = parser.parse_args(argv)
    cores = CoreShare(args.cores_file) if args.cores_file else None
    found = run(Path(args.out), quick=args.quick, progress=not args.no_progress, cores=cores)
    return 0 if "unavailable" not in found else 3


if __name__ == "__main__":
    import sys

    from cactus_theory.util.process import exit_with_parent

    exit_with_parent()  # a child of `cactus report` must not outlive it
    sys.exit(main())
