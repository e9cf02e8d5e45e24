"""The layers of ``cactus_theory`` import only downwards: util <- core <- sampler <- decode
<- real <- cli and decode <- vllm <- cli, except that vllm never imports decode nor real
(what both engines share, such as the divergence meter, lives in sampler). ``real`` (real
models and data: datasets, wheels, the pairs, pools, draft training) never imports vllm.
``engines`` (the engines' rules, plug-ins of the core) sits on the core and never imports
torch either; ``testing`` (the kit) imports the sampler and torch only in its torch checks.

Two checks. Static: every import statement in every file of a layer (module level and
inside functions) names only the layers it may use. Dynamic: importing the numpy core,
``proofs_check`` and running ``cactus check`` in a fresh interpreter never loads torch.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cactus_theory"

#: What each layer may import, besides the standard library and numpy/scipy (the core's
#: numerics). Third-party names are top-level modules; our own are dotted prefixes.
ALLOWED = {
    "util": {"cactus_theory.util"},
    "core": {"cactus_theory.util", "cactus_theory.core", "numpy", "scipy"},
    # The engines' rules: plug-ins written with the public rule API (numpy or array API).
    "engines": {"cactus_theory.util", "cactus_theory.core", "cactus_theory.engines"},
    # The property-test kit: numpy checks on the core; torch imported inside the torch checks.
    "testing": {
        "cactus_theory.util",
        "cactus_theory.core",
        "cactus_theory.sampler",
        "cactus_theory.testing",
        "numpy",
        "scipy",
        "torch",
    },
    # The conformance suite's engine adapters: they wrap engines (transformers, vLLM, this
    # project's vLLM plug-in), so they sit above the kit, like cli; imported only by cli.
    "testing/conformance/adapters": {
        "cactus_theory.util",
        "cactus_theory.core",
        "cactus_theory.sampler",
        "cactus_theory.testing",
        "cactus_theory.vllm",
        "numpy",
        "scipy",
        "torch",
        "transformers",
        "vllm",
    },
    "sampler": {
        "cactus_theory.util",
        "cactus_theory.core",
        "cactus_theory.sampler",
        "torch",
        "numpy",  # the generic adapter hands numpy rows to rules written with numpy
    },
    "decode": {
        "cactus_theory.util",
        "cactus_theory.core",
        "cactus_theory.sampler",
        "cactus_theory.decode",
        "torch",
        "transformers",
        "huggingface_hub",
        "numpy",
        "tqdm",
    },
    # Real models and data: datasets, wheels, pairs, pools, draft training; never vllm.
    "real": {
        "cactus_theory.util",
        "cactus_theory.core",
        "cactus_theory.sampler",
        "cactus_theory.decode",
        "cactus_theory.real",
        "torch",
        "transformers",
        "huggingface_hub",
        "numpy",
        "scipy",
        "tqdm",
    },
    # vllm never imports decode (nor decode vllm): what both engines share lives in sampler.
    "vllm": {
        "cactus_theory.util",
        "cactus_theory.core",
        "cactus_theory.sampler",
        "cactus_theory.vllm",
        "torch",
        "transformers",
        "vllm",
    },
}
#: The packages beside cactus_theory: proofs_check and paper_figs use the numpy core (and
#: paper_figs the real-model section of ``cactus_theory.real``, whose torch imports are
#: lazy; ``cactus report``, in paper_figs, runs sims, proofs_check and that section, then
#: draws their results).
BESIDE = {
    "proofs_check": {
        "cactus_theory.util",
        "cactus_theory.core",
        "cactus_theory.testing",  # cactus check --rule (torch only inside its torch checks)
        "proofs_check",
        "numpy",
        "scipy",
        "tqdm",
    },
    "paper_figs": {
        "cactus_theory.util",
        "cactus_theory.core",
        "cactus_theory.real",
        "paper_figs",
        "proofs_check",
        "sims",
        "numpy",
        "tqdm",
    },
}
#: The core modules that are also real submodules of the package root
#: (``cactus_theory/rules.py`` is ``cactus_theory.core.rules``).
ROOT_MODULES = {"divergences", "law", "rules", "trees"}
#: Our packages outside cactus_theory, and the heavy libraries a layer below cli must
#: never name.
OURS = ("cactus_theory", "proofs_check", "sims", "paper_figs")
WATCHED = ("torch", "transformers", "vllm", "huggingface_hub", "numpy", "scipy", "tqdm")


def imported_names(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names (absolute, dotted)."""
    names = set()
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def violations(layer: str) -> list[str]:
    """Imports in ``cactus_theory/<layer>`` (or the package ``layer`` beside it) that its
    allowed set does not cover, sorted."""
    allowed = ALLOWED[layer] if layer in ALLOWED else BESIDE[layer]
    folder = PACKAGE / layer if layer in ALLOWED else ROOT / layer
    # A folder inside the layer with its own entry (a sub-layer) is checked by that entry.
    inner = [PACKAGE / key for key in ALLOWED if key != layer and key.startswith(layer + "/")]
    found = []
    for path in sorted(folder.rglob("*.py")):
        if any(path.is_relative_to(sub) for sub in inner):
            continue
        for name in sorted(imported_names(path)):
            top = name.split(".")[0]
            parts = name.split(".")
            if name.startswith("cactus_theory.") and parts[1] in ROOT_MODULES:
                name = "cactus_theory.core." + ".".join(parts[1:])  # a root submodule
            if top in OURS:
                ok = any(name == prefix or name.startswith(prefix + ".") for prefix in allowed)
                # ``from cactus_theory import x`` names the root package (the core) itself.
                ok = ok or (name == "cactus_theory" and "cactus_theory.core" in allowed)
            elif top in WATCHED:
                ok = top in allowed
            else:
                continue
            if not ok:
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED) + sorted(BESIDE))
def test_layer_imports_only_what_is_below_it(layer):
    if layer in ALLOWED and not (PACKAGE / layer).is_dir():
        pytest.skip(f"no {layer} layer yet")
    assert violations(layer) == []


def test_the_package_root_is_the_core_public_modules_and_nothing_else():
    """``cactus_theory/__init__.py`` imports nothing; each root submodule imports only its
    core module and is that very module, however it is imported."""
    import importlib

    import cactus_theory

    assert {n for n in imported_names(PACKAGE / "__init__.py") if n.startswith("cactus_")} == set()
    assert set(cactus_theory.PUBLIC_CORE_MODULES) == ROOT_MODULES
    roots = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert roots == ROOT_MODULES  # no other module at the root
    for name in sorted(ROOT_MODULES):
        path = PACKAGE / f"{name}.py"
        ours = {n for n in imported_names(path) if n.startswith("cactus_")}
        assert ours == {"cactus_theory.core", f"cactus_theory.core.{name}"}
        core = importlib.import_module(f"cactus_theory.core.{name}")
        assert importlib.import_module(f"cactus_theory.{name}") is core
        assert getattr(cactus_theory, name) is core


def test_the_checker_catches_a_violation(tmp_path, monkeypatch):
    """Negative controls: a core file that imports torch, a real file that imports vllm
    and sims, and a vllm file that imports decode are reported."""
    fake_root = tmp_path
    core = fake_root / "cactus_theory" / "core"
    core.mkdir(parents=True)
    (core / "bad.py").write_text(
        "def f():\n    import torch\n    from cactus_theory.sampler import verify\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake_root / "cactus_theory")
    assert violations("core") == [
        "cactus_theory/core/bad.py imports cactus_theory.sampler",
        "cactus_theory/core/bad.py imports cactus_theory.sampler.verify",
        "cactus_theory/core/bad.py imports torch",
    ]
    real = fake_root / "cactus_theory" / "real"
    real.mkdir()
    (real / "bad.py").write_text("import vllm\nfrom sims import pools\n")
    assert violations("real") == [
        "cactus_theory/real/bad.py imports sims",
        "cactus_theory/real/bad.py imports sims.pools",
        "cactus_theory/real/bad.py imports vllm",
    ]
    vllm = fake_root / "cactus_theory" / "vllm"
    vllm.mkdir()
    (vllm / "bad.py").write_text("from cactus_theory.decode.meter import positions_below\n")
    assert violations("vllm") == [
        "cactus_theory/vllm/bad.py imports cactus_theory.decode.meter",
        "cactus_theory/vllm/bad.py imports cactus_theory.decode.meter.positions_below",
    ]


NO_TORCH = """
import sys
{body}
loaded = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "transformers"))
assert not loaded, loaded
print("ok")
"""


@pytest.mark.parametrize(
    "body",
    [
        "import cactus_theory, cactus_theory.rules\nfrom cactus_theory import divergences, law\n"
        "from cactus_theory.core import block, gamma, processors, roots, validate, verify\n"
        "assert 'sglang' in cactus_theory.rules.NAMES  # discovery loads the engines' rules",
        "import proofs_check, proofs_check.claims, proofs_check.runner, proofs_check.cli\n"
        "from proofs_check import checks_closed_form, checks_exact, checks_laws",
        "from cactus_theory.cli import dispatch\n"
        "code = dispatch.main(['check', '--quick', '--only', 'overshoot', '--json', {json!r}])\n"
        "assert code == 0, code",
    ],
    ids=["numpy-core", "proofs_check", "cactus-check"],
)
def test_torch_is_never_imported(body, tmp_path):
    script = NO_TORCH.format(body=body.format(json=str(tmp_path / "r.json")))
    env_cache = {"CACTUS_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, **env_cache},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
