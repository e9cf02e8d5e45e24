"""Sweeps: rules × budgets × k × sources, one cached cell at a time, written as tidy CSV.

A sweep is a list of *cells*. Each cell is computed once, written atomically to
``OUT/cells/<kind>/<key>.json`` (the key hashes everything the cell depends on: its kind,
source settings, rule, k, sizes, seed, ``SCHEMA`` and the source code of cactus_theory and
sims) and read back from there on every
later run, so an interrupted sweep resumes where it stopped and never recomputes a finished
cell. Cell kinds:

- ``tradeoff`` (source, rule): exact pool means of acceptance, emitted KL/TV and the
  per-branch KL (``sims.tradeoff``), for the acceptance–divergence curves;
- ``decode`` (source, rule, k): Monte Carlo decoding (``sims.montecarlo``); i.i.d. on
  synthetic pools, autoregressive on real text;
- ``calibration`` (source): the parameters at which cactus-exact, frontier, pareto and interp
  reach the exact acceptance of the reference rule (cactus δ = 1) on the text pool; its
  ``matched`` decode cells feed the sequence-divergence figure;
- ``engines`` (source, rule): an engine's relaxed rule (``cactus_theory.engines``: SGLang's
  thresholds, TensorRT-LLM's relaxed top-K, the vLLM proposals' top-K ratio) at a
  published or proposed setting, with cactus, cactus-exact and frontier tuned to its exact
  acceptance (``tradeoff.match_acceptance``): what each pays in emitted KL and TV for the
  same acceptance (none when the engine's rule accepts less than SpS, which is lossless);
- ``gamma``, ``drafted``, ``example``: the data of single figures (``sims.figure_data``).

Outputs (``sweep_csv.write_csvs``), one row per cell unless stated: ``tradeoff.csv``,
``decoding.csv``, ``engines.csv``, ``positions.csv`` (one row per cell and position),
``sequence_kl.csv`` (one row per cell and generated length), ``speedup.csv``, ``gamma.csv``,
``drafted.csv``, ``example.json``. Randomness: every cell derives its generator from the
sweep seed, the source and k (not the rule), so rules see common random numbers and the
same prompts.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from cactus_theory import rules
from cactus_theory.core import validate
from cactus_theory.core.processors import PAPER_SETTING, PLAIN_SETTING, SamplingSettings
from cactus_theory.util import provenance
from cactus_theory.util.files import atomic_write_bytes, check_writable_folder
from cactus_theory.util.provenance import fingerprint
from sims import figure_data, montecarlo, realtext, sweep_csv, synthetic, tradeoff
from sims.pools import PairPool

SCHEMA = 1
#: The code a cell's value depends on: editing a rule or a simulation starts fresh cells.
CODE = provenance.source_fingerprint(
    "cactus_theory/core", "cactus_theory/util", "cactus_theory/real/corpus.py", "sims"
)

#: Rules swept at every budget (δ), and the parameter-free or fixed ones.
BUDGET_RULES = ("cactus", "cactus-exact", "frontier")


@dataclass(frozen=True)
class SyntheticSource:
    """A synthetic pool: ``kind`` in dirichlet / zipf / peaked with its main parameter."""

    kind: str
    value: float
    vocab_size: int = 50
    num_pairs: int = 2000
    decode: bool = False

    @property
    def name(self) -> str:
        return {"dirichlet": "dirichlet-{:g}", "zipf": "zipf-tv{:g}", "peaked": "peaked-{:g}"}[
            self.kind
        ].format(self.value)

    def build(self, seed: int) -> PairPool:
        common = {"vocab_size": self.vocab_size, "num_pairs": self.num_pairs, "seed": seed}
        if self.kind == "dirichlet":
            return synthetic.dirichlet_pool(self.value, **common)
        if self.kind == "zipf":
            return synthetic.zipf_pool_at_tv(self.value, **common)
        if self.kind == "peaked":
            return synthetic.peaked_pool(self.value, **common)
        raise ValueError(f"kind: unknown synthetic source {self.kind!r}")


@dataclass(frozen=True)
class TextSource:
    """The real-text source under one sampling setting; ``decode_rules`` None = full grid."""

    name: str = "text"
    sampling: SamplingSettings = PAPER_SETTING
    contexts: int = 1500
    decode_rules: tuple[str, ...] | None = None
    decode_ks: tuple[int, ...] | None = None
    sequences: int | None = None


@dataclass(frozen=True)
class SweepConfig:
    """Everything a sweep computes; ``QUICK`` and ``FULL`` are the report's presets."""

    label: str = "custom"
    seed: int = 0
    ks: tuple[int, ...] = (5, 10, 20)
    budgets: tuple[float, ...] = (0.25, 0.75, 1.0, 2.0)
    alphas: tuple[float, ...] = (0.5,)
    topks: tuple[int, ...] = (3,)
    curve_budgets: tuple[float, ...] = tuple(float(v) for v in np.geomspace(1e-3, 8.0, 12))
    curve_alphas: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75)
    curve_spreads: tuple[float, ...] = tuple(float(v) for v in np.geomspace(0.05, 20.0, 28))
    curve_topks: tuple[int, ...] = (1, 3)
    synthetic: tuple[SyntheticSource, ...] = (
        SyntheticSource("dirichlet", 0.3, num_pairs=600, decode=True),
        SyntheticSource("zipf", 0.4, vocab_size=200, num_pairs=300),
        SyntheticSource("peaked", 0.9, num_pairs=600),
    )
    pool_decode_rules: tuple[str, ...] = (
        "sps",
        "tas",
        "cactus:delta=0.1",
        "cactus:delta=1.0",
        "cactus-exact:delta=0.1",
        "frontier:delta=0.1",
        "pareto:spread=1.0",
    )
    text: tuple[TextSource, ...] = (TextSource(),)
    text_sequences: int = 128
    text_length: int = 12
    matched_sequences: int = 24
    matched_length: int = 64
    pool_sequences: int = 48
    pool_length: int = 120
    matched_k: int = 10
    matched_reference: str = "cactus:delta=1.0"
    matched_rules: tuple[str, ...] = ("cactus-exact", "frontier", "pareto", "interp")
    #: The engines' rules at the settings they publish or propose (TensorRT-LLM's
    #: DeepSeek-R1 preset, AMD ATOM's hard-coded one, SGLang thresholds, a vLLM proposal).
    engine_rules: tuple[str, ...] = (
        "relaxed:top_k=10,delta=0.6",
        "relaxed:top_k=8,delta=0.5",
        "sglang:threshold_single=0.5,threshold_acc=0.5",
        "sglang:threshold_single=0.2,threshold_acc=0.2",
        "relaxed-ratio:top_k=4,ratio=0.5",
    )
    engines_matched: tuple[str, ...] = ("cactus", "cactus-exact", "frontier")
    gamma_deltas: tuple[float, ...] = (0.05, 0.25, 1.0)
    speedup_costs: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2)

    def __post_init__(self) -> None:
        validate_config(self)

    def with_seed(self, seed: int) -> SweepConfig:
        return replace(self, seed=seed)


def validate_config(config: SweepConfig) -> None:
    """Bad settings get a ValueError naming the field."""
    if isinstance(config.seed, bool) or not isinstance(config.seed, int) or config.seed < 0:
        raise ValueError(f"seed: must be an integer >= 0, got {config.seed!r}")
    if not config.synthetic and not config.text:
        raise ValueError("sources: the sweep has no source (synthetic and text are both empty)")
    for name in ("ks", "topks", "curve_topks"):
        values = getattr(config, name)
        for value in values:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: k must be an integer >= 1, got {value!r}")
    if not config.ks:
        raise ValueError("ks: needs at least one k")
    for name in ("budgets", "curve_budgets", "gamma_deltas", "curve_spreads"):
        for value in getattr(config, name):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: δ must be a finite number >= 0, got {value!r}")
    for name in ("alphas", "curve_alphas"):
        for value in getattr(config, name):
            validate.unit_interval(name, value)
    for name in (
        "text_sequences",
        "text_length",
        "matched_sequences",
        "matched_length",
        "pool_sequences",
        "pool_length",
        "matched_k",
    ):
        validate.positive_int(name, getattr(config, name))
    for source in config.text:
        validate.positive_int("contexts", source.contexts)
        for k in source.decode_ks or ():
            validate.positive_int("ks", k)
    for spec in (*config.pool_decode_rules, config.matched_reference):
        rules.parse(spec)


QUICK = SweepConfig(label="quick")
FULL = SweepConfig(
    label="full",
    budgets=(0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0),
    alphas=(0.25, 0.5, 0.75),
    topks=(1, 3),
    curve_budgets=tuple(float(v) for v in np.geomspace(1e-3, 8.0, 25)),
    curve_alphas=(0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 0.9),
    curve_spreads=tuple(float(v) for v in np.geomspace(0.02, 30.0, 48)),
    curve_topks=(1, 2, 3, 5),
    synthetic=(
        SyntheticSource("dirichlet", 0.1, decode=True),
        SyntheticSource("dirichlet", 1.0, decode=True),
        SyntheticSource("zipf", 0.2, vocab_size=200, decode=True),
        SyntheticSource("zipf", 0.5, vocab_size=200),
        SyntheticSource("peaked", 0.9, decode=True),
    ),
    text=(
        TextSource(contexts=4000),
        TextSource(
            name="text-T1",
            sampling=PLAIN_SETTING,
            contexts=200,
            decode_rules=(
                "sps",
                "tas",
                "cactus:delta=0.75",
                "cactus:delta=1.0",
                "cactus-exact:delta=1.0",
                "frontier:delta=1.0",
            ),
            decode_ks=(10,),
            sequences=16,
        ),
    ),
    text_sequences=256,
    text_length=32,
    matched_sequences=64,
    matched_length=128,
    pool_sequences=128,
    pool_length=400,
    gamma_deltas=(0.01, 0.05, 0.25, 1.0, 4.0),
)


#: A seconds-long configuration (tests, smoke runs): every cell kind, tiny sizes.
TINY = SweepConfig(
    label="tiny",
    ks=(2, 10),
    budgets=(1.0,),
    alphas=(0.5,),
    topks=(3,),
    curve_budgets=(0.01, 0.1, 1.0),
    curve_alphas=(0.1, 0.5),
    curve_spreads=(0.5, 1.0, 2.0, 4.0),
    curve_topks=(1,),
    synthetic=(SyntheticSource("dirichlet", 0.5, vocab_size=12, num_pairs=60, decode=True),),
    pool_decode_rules=("sps", "cactus:delta=1.0"),
    text=(TextSource(contexts=150),),
    text_sequences=16,
    text_length=4,
    matched_sequences=8,
    matched_length=6,
    pool_sequences=16,
    pool_length=10,
    matched_k=2,
    gamma_deltas=(0.25, 1.0),
    speedup_costs=(0.05,),
)


# -- the plan -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    kind: str
    source: str
    rule: str = ""
    k: int = 0
    group: str = "grid"
    extra: tuple = field(default=())


def curve_rules(config: SweepConfig) -> list[str]:
    specs = ["sps", "tas"]
    specs += [f"topk:k={k}" for k in config.curve_topks]
    for name in BUDGET_RULES:
        specs += [f"{name}:delta={value!r}" for value in config.curve_budgets]
    specs += [f"interp:alpha={value!r}" for value in config.curve_alphas]
    specs += [f"pareto:spread={value!r}" for value in config.curve_spreads]
    return specs + list(config.engine_rules)


def decode_rules(config: SweepConfig) -> list[str]:
    specs = ["sps", "tas"]
    specs += [f"topk:k={k}" for k in config.topks]
    for name in BUDGET_RULES:
        specs += [f"{name}:delta={float(value)!r}" for value in config.budgets]
    specs += [f"interp:alpha={float(value)!r}" for value in config.alphas]
    return specs


def plan(config: SweepConfig) -> list[Cell]:
    """Every cell except the matched decode cells (which need the calibration first)."""
    cells: list[Cell] = []
    sources = [s.name for s in config.synthetic] + [s.name for s in config.text]
    for source in sources:
        cells += [Cell("tradeoff", source, spec) for spec in curve_rules(config)]
        cells += [Cell("engines", source, spec) for spec in config.engine_rules]
    for source in config.synthetic:
        if source.decode:
            cells += [
                Cell("decode", source.name, spec, k)
                for k in config.ks
                for spec in config.pool_decode_rules
            ]
    for text in config.text:
        ks = text.decode_ks or config.ks
        specs = list(text.decode_rules) if text.decode_rules else decode_rules(config)
        cells += [Cell("decode", text.name, spec, k) for k in ks for spec in specs]
    if config.text:
        main = config.text[0].name
        cells.append(Cell("calibration", main, config.matched_reference))
        cells.append(Cell("gamma", "", "", 0, "figure", tuple(config.gamma_deltas)))
        cells.append(Cell("drafted", main, "", 0, "figure", tuple(config.gamma_deltas)))
        cells.append(Cell("example", main, "", 0, "figure"))
    return cells


# -- sources --------------------------------------------------------------------------------


class Sources:
    """Builds each source once per run, only when a cell that needs it is computed."""

    def __init__(self, config: SweepConfig) -> None:
        self.config = config
        self._pools: dict[str, PairPool] = {}
        self._synthetic = {s.name: s for s in config.synthetic}
        self._text = {s.name: s for s in config.text}

    def describe(self, name: str) -> dict:
        """The settings a source depends on (part of every cell key)."""
        if name in self._synthetic:
            return {"synthetic": asdict(self._synthetic[name]) | {"decode": None}}
        if name in self._text:
            text = self._text[name]
            return {
                "text": realtext.TextSettings(sampling=text.sampling).as_dict(),
                "contexts": text.contexts,
            }
        if name == "":
            return {}
        raise ValueError(f"source: unknown source {name!r}")

    def is_text(self, name: str) -> bool:
        return name in self._text

    def models(self, name: str) -> realtext.TextModels:
        return realtext.TextModels.from_corpus(
            realtext.TextSettings(sampling=self._text[name].sampling)
        )

    def pool(self, name: str) -> PairPool:
        if name not in self._pools:
            seed = self.config.seed
            if name in self._synthetic:
                self._pools[name] = self._synthetic[name].build(seed)
            else:
                text = self._text[name]
                self._pools[name] = realtext.heldout_pool(
                    self.models(name), text.contexts, seed=seed, name=name
                )
        return self._pools[name]

    def decode_sizes(self, cell: Cell) -> tuple[int, int]:
        """(number of sequences, generated tokens per sequence) for a decode cell."""
        config = self.config
        if cell.source not in self._text:
            return config.pool_sequences, config.pool_length
        if cell.group == "matched":
            return config.matched_sequences, config.matched_length
        return self._text[cell.source].sequences or config.text_sequences, config.text_length


# -- cells ----------------------------------------------------------------------------------


def stable_int(*parts: object) -> int:
    """A 63-bit integer from a fingerprint of ``parts`` (stable across runs and machines)."""
    return int(fingerprint(*parts), 16) & ((1 << 63) - 1)


def cell_key(cell: Cell, config: SweepConfig, sources: Sources) -> str:
    """The cache key: everything the cell's value depends on, and nothing else."""
    sizes = sources.decode_sizes(cell) if cell.kind == "decode" else ()
    return fingerprint(
        SCHEMA, CODE, asdict(cell), sources.describe(cell.source), sizes, config.seed
    )


def compute_cell(cell: Cell, config: SweepConfig, sources: Sources) -> dict:
    """The JSON-ready result of one cell (see the module docstring)."""
    if cell.kind == "tradeoff":
        rule = rules.parse(cell.rule)
        return tradeoff.summary(tradeoff.row_stats(rule, sources.pool(cell.source)))
    if cell.kind == "decode":
        return _decode(cell, config, sources)
    if cell.kind == "calibration":
        pool = sources.pool(cell.source)
        reference = rules.parse(cell.rule)
        goal = float(tradeoff.summary(tradeoff.row_stats(reference, pool))["acceptance"])
        matched = {}
        for name in config.matched_rules:
            rule, _ = tradeoff.match_acceptance(name, pool, goal)
            matched[name] = rules.spec_of(rule)
        return {"goal": goal, "reference": cell.rule, "matched": matched}
    if cell.kind == "engines":
        return _engines(cell, config, sources.pool(cell.source))
    if cell.kind == "gamma":
        return {"rows": figure_data.gamma_curves(cell.extra)}
    if cell.kind == "drafted":
        pool = sources.pool(cell.source)
        return {"rows": figure_data.drafted_masses(pool, cell.extra, seed=config.seed)}
    if cell.kind == "example":
        pool = sources.pool(cell.source)
        models = sources.models(cell.source)
        return figure_data.worked_example(pool, figure_data.pick_example(pool), models.token_text)
    raise ValueError(f"kind: unknown cell kind {cell.kind!r}")  # pragma: no cover


def _engines(cell: Cell, config: SweepConfig, pool: PairPool) -> dict:
    """An engine's rule and each rule of ``engines_matched`` at its exact acceptance."""
    engine = tradeoff.summary(tradeoff.row_stats(rules.parse(cell.rule), pool))
    lossless = tradeoff.summary(tradeoff.row_stats(rules.make("sps"), pool))["acceptance"]
    matched = {}
    for name in config.engines_matched:
        if engine["acceptance"] < lossless:
            # Below SpS: lossless decoding already accepts more, at KL 0.
            matched[name] = {"below_sps": lossless}
            continue
        try:
            rule, _ = tradeoff.match_acceptance(name, pool, engine["acceptance"])
        except ValueError as error:  # out of that rule's reach on this pool
            matched[name] = {"unreachable": str(error)}
            continue
        matched[name] = {
            "rule": rules.spec_of(rule),
            **tradeoff.summary(tradeoff.row_stats(rule, pool)),
        }
    return {"rule": cell.rule, "engine": engine, "sps_acceptance": lossless, "matched": matched}


def _decode(cell: Cell, config: SweepConfig, sources: Sources) -> dict:
    rule = rules.parse(cell.rule)
    seed = stable_int(config.seed, cell.source, cell.k, "decode")
    count, length = sources.decode_sizes(cell)
    settings = montecarlo.DecodeSettings(cell.k, count, length)
    if sources.is_text(cell.source):
        models = sources.models(cell.source)
        prompts = models.prompts(
            count, np.random.default_rng(stable_int(config.seed, cell.source, "prompts"))
        )
        result = montecarlo.simulate_text(rule, models, settings, seed=seed, prompts=prompts)
    else:
        result = montecarlo.simulate_pool(rule, sources.pool(cell.source), settings, seed=seed)
    return result.as_dict()


def _encode(value: dict) -> bytes:
    return json.dumps(value, sort_keys=True, allow_nan=True).encode()


class CellStore:
    """``OUT/cells/<kind>/<key>.json``, written atomically.

    Each file is a record ``{"kind": ..., "key": ..., "value": {...}}``. Anything else found
    under a cell's name (empty, truncated, not JSON, JSON of another shape or another
    cell's record) is treated as missing, so the cell is recomputed and the file replaced.
    """

    def __init__(self, out_dir: Path) -> None:
        self.root = Path(out_dir) / "cells"

    def path(self, cell: Cell, key: str) -> Path:
        return self.root / cell.kind / f"{key}.json"

    def load(self, cell: Cell, key: str) -> dict | None:
        path = self.path(cell, key)
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return None  # a damaged file is recomputed
        if (
            not isinstance(record, dict)
            or record.get("kind") != cell.kind
            or record.get("key") != key
            or not isinstance(record.get("value"), dict)
        ):
            return None  # a file of the wrong shape is recomputed
        return record["value"]

    def save(self, cell: Cell, key: str, value: dict) -> dict:
        data = _encode({"kind": cell.kind, "key": key, "value": value})
        atomic_write_bytes(self.path(cell, key), data)
        return json.loads(data)["value"]


def prepare_output(out_dir: object) -> Path:
    """Create ``out_dir`` and check it is writable (ValueError naming ``out`` otherwise)."""
    return check_writable_folder("out", os.fspath(out_dir))


@dataclass
class SweepResult:
    config: SweepConfig
    cells: list[tuple[Cell, dict]]
    computed: int
    paths: dict[str, Path]


def run(
    config: SweepConfig,
    out_dir: object,
    *,
    progress: bool = True,
    compute: Callable[[Cell, SweepConfig, Sources], dict] | None = None,
) -> SweepResult:
    """Compute (or load) every cell, then write the CSVs under ``out_dir``."""
    from tqdm import tqdm

    out = prepare_output(out_dir)
    compute = compute or compute_cell
    sources = Sources(config)
    store = CellStore(out)
    cells = plan(config)
    done: list[tuple[Cell, dict]] = []
    computed = 0
    bar = tqdm(total=len(cells), desc=f"sweep ({config.label})", unit="cell", disable=not progress)

    def settle(batch: Iterable[Cell]) -> None:
        nonlocal computed
        for cell in batch:
            key = cell_key(cell, config, sources)
            value = store.load(cell, key)
            if value is None:
                bar.set_postfix_str(f"{cell.kind} {cell.source} {cell.rule} k={cell.k}"[:60])
                value = store.save(cell, key, compute(cell, config, sources))
                computed += 1
            done.append((cell, value))
            bar.update(1)

    try:
        settle(cells)
        matched = _matched_cells(config, done)
        bar.total += len(matched)
        bar.refresh()
        settle(matched)
    finally:
        bar.close()
    paths = sweep_csv.write_csvs(config, done, out, sources)
    return SweepResult(config, done, computed, paths)


def _matched_cells(config: SweepConfig, done: list[tuple[Cell, dict]]) -> list[Cell]:
    for cell, value in done:
        if cell.kind == "calibration":
            specs = [cell.rule, "sps", "tas", *value["matched"].values()]
            return [
                Cell("decode", cell.source, spec, config.matched_k, "matched") for spec in specs
            ]
    return []
