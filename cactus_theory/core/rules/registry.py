"""The rule registry: built-in rules, ``register``, plug-ins, and specs (``make``, ``parse``).

A rule enters the registry in one of four ways, and is then known by name everywhere (every
CLI ``--rule``, the decoder, the report, vLLM's workers):

1. built in (``BUILTINS``: the nine rules of ``cactus_theory.core.rules``);
2. ``register(cls)`` in code (a name already taken by another class is a ValueError;
   registering the same class again does nothing, so modules may be imported twice);
3. the engines' rules (``cactus_theory.engines``: SGLang's, TensorRT-LLM's and the vLLM
   proposals'), loaded at discovery like any plug-in, through ``register``;
4. plug-ins, found once on first use (``discover``): every entry point of the group
   ``cactus_theory.rules`` (a ``Rule`` subclass, registered, or a module, imported), and
   every module named in ``CACTUS_RULES_MODULES`` (comma-separated module names or paths
   to ``.py`` files; ``--rules-module`` of every command sets it for child processes too).
   A file is imported with its folder on ``sys.path`` (while it runs), so it may import a
   module beside it.
   A plug-in that fails to load is a warning naming it, and discovery goes on; a module the
   user named (``CACTUS_RULES_MODULES``, ``--rules-module``) that fails is a ValueError.
   A plug-in never shadows a rule already registered: a clash is a warning naming both.

``refresh()`` forgets the plug-ins and scans again. A spec never imports anything: ``parse``
resolves names in the registry only, so a request carrying a spec cannot load code.

Parameters: ``make(name, **params)`` takes the keyword parameters of the rule's
``__init__``; ``parse("name:key=value,...")`` converts each value to the type its
``__init__`` annotation declares (``int``, ``float``, ``str``, ``bool``; ``float`` when
unannotated), and ``make`` converts a string value the same way (``convert_params``).
Refused at registration: ``*args``/``**kwargs`` in a rule's ``__init__``, and an
``__init__`` with parameters in a class that defines no ``params()`` (its rules would all be
equal, with one spec). An unknown name says which registered names are close and how to
make a rule of one's own known.
A class whose ``spec_rest`` names one parameter takes the whole rest of its spec as that
parameter's value (``"lift:cactus:delta=0.5"``: a tree rule built from a chain spec).

Kinds: the registry holds one ``Kind`` per base class, the chain rules (``RULES``, the
module-level functions) and any kind added with ``add_kind`` (the tree rules of
``cactus_theory.core.trees``). Discovery is shared: a plug-in module may register rules
of every kind, and an entry point may name a class of any kind.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cactus_theory.core.rules.base import Rule

#: The entry-point group installed packages register their rules under.
ENTRY_POINT_GROUP = "cactus_theory.rules"
#: Environment variable: modules (comma-separated names or .py paths) imported at discovery.
ENV_MODULES = "CACTUS_RULES_MODULES"
#: Plug-in modules that ship with the package and register through ``register``.
BUNDLED = ("cactus_theory.engines",)
#: What a rule name may look like (it must survive a spec: no ':', ',', '=' or spaces).
NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")


@dataclass(eq=False)
class Kind:
    """One kind of registered class: its base class and its names (``registry``), the
    built-in names (kept by ``refresh``) and who provided each name."""

    noun: str  # "rule", "tree rule": how messages name one
    base: type  # every class of this kind subclasses it
    base_name: str  # how users write the base, e.g. "rules.Rule"
    registry: dict[str, type] = field(default_factory=dict)
    builtin: set[str] = field(default_factory=set)
    providers: dict[str, str] = field(default_factory=dict)


#: The chain rules (``rules.register``, ``rules.make``, ...).
RULES = Kind("rule", Rule, "rules.Rule")
#: Every kind, chain rules first (``add_kind`` adds one).
KINDS: list[Kind] = [RULES]
REGISTRY: dict[str, type[Rule]] = RULES.registry
_BUILTIN_NAMES: set[str] = RULES.builtin
_PROVIDERS: dict[str, str] = RULES.providers
#: The classes (with their kind) each plug-in source registered when it was loaded (a
#: module is imported once, so after ``refresh`` its rules are registered again from here).
_LOADED: dict[str, list[tuple[Kind, type]]] = {}
_discovered = False
_discovering = False


def add_kind(kind: Kind) -> Kind:
    """Add a kind of registered class (once; returns it). Its plug-ins are found by the
    same discovery as the chain rules'."""
    if all(kind is not known for known in KINDS):
        KINDS.append(kind)
    return kind


# --- registration -------------------------------------------------------------------------


def _parameters(cls: type[Rule]) -> dict[str, inspect.Parameter]:
    """The keyword parameters of ``cls.__init__`` (ValueError for *args / **kwargs)."""
    if cls.__init__ is object.__init__:  # no __init__ of its own: no parameters
        return {}
    signature = inspect.signature(cls.__init__)
    named = {}
    for key, parameter in signature.parameters.items():
        if key == "self":
            continue
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ValueError(
                f"cls: {cls.__name__}.__init__ takes *{key}; a rule's parameters must be "
                "named (they are parsed from specs)"
            )
        named[key] = parameter
    return named


def register(cls: type[Rule], *, provider: str | None = None, kind: Kind = RULES) -> type[Rule]:
    """Add the rule class ``cls`` under ``cls.name``; returns ``cls`` (usable as a decorator).

    ValueError when ``cls`` is not a concrete subclass of the kind's base (``Rule``), its
    name is not a valid rule name, its ``__init__`` takes ``*args``/``**kwargs``, or the name
    is taken by another class. Registering the same class twice is a no-op.
    """
    if not (isinstance(cls, type) and issubclass(cls, kind.base)):
        raise ValueError(f"cls: expected a subclass of {kind.base_name}, got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ValueError(
            f"cls: {cls.__name__}.name must be a string like 'my-rule' (letters, digits, "
            f"'-', '_', '.'), got {name!r}"
        )
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise ValueError(f"cls: {cls.__name__} is abstract; it must define {missing}")
    parameters = _parameters(cls)
    if parameters and cls.params is kind.base.params:
        listed = ", ".join(parameters)
        first = next(iter(parameters))
        raise ValueError(
            f"cls: {cls.__name__}.__init__ takes parameters ({listed}) but the class defines "
            f"no params(); define params() returning them (e.g. "
            f"``return {{{first!r}: self.{first}}}``), or rules with different parameters "
            "would be equal, with one spec, label and hash"
        )
    existing = kind.registry.get(name)
    if existing is cls:
        return cls
    if existing is not None:
        raise ValueError(
            f"name: {kind.noun} {name!r} is already registered ({_describe(existing)}); "
            f"choose another name for {_describe(cls)}"
        )
    kind.registry[name] = cls
    kind.providers[name] = provider or _describe(cls)
    return cls


def _describe(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _register_builtins() -> None:
    from cactus_theory.core.rules.baselines import Greedy, Interp, TopK, TypicalAcceptance
    from cactus_theory.core.rules.cactus import Cactus, CactusExact
    from cactus_theory.core.rules.frontier import Frontier
    from cactus_theory.core.rules.pareto import ParetoFrontier
    from cactus_theory.core.rules.sps import SpS

    for cls in (SpS, Cactus, CactusExact, Frontier, ParetoFrontier):
        register(cls)
    for cls in (Interp, TypicalAcceptance, TopK, Greedy):
        register(cls)
    _BUILTIN_NAMES.update(REGISTRY)


# --- discovery ------------------------------------------------------------------------------


def names(kind: Kind = RULES) -> tuple[str, ...]:
    """Every registered rule name (built-ins first), after discovery."""
    discover()
    return tuple(kind.registry)


def discover() -> None:
    """Load the plug-ins once (module docstring); later calls do nothing until ``refresh``."""
    global _discovered, _discovering
    if _discovered or _discovering:
        return
    _discovering = True
    try:
        for module in BUNDLED:
            _load_plugin(module, functools.partial(importlib.import_module, module))
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _load_plugin(f"entry point {entry.name} = {entry.value}", entry.load)
        load_modules(_env_modules(), argument=ENV_MODULES)
        _discovered = True
    finally:
        _discovering = False


def refresh() -> None:
    """Forget every rule that is not built in, and discover the plug-ins again."""
    global _discovered
    for kind in KINDS:
        for name in [name for name in kind.registry if name not in kind.builtin]:
            del kind.registry[name]
            kind.providers.pop(name, None)
    _discovered = False
    discover()


def _load_plugin(source: str, load: typing.Callable[[], object]) -> None:
    """Load one plug-in: a rule class (of any kind) is registered, a module registers itself. A
    failure or a clash with a registered name is a RuntimeWarning; discovery goes on."""
    try:
        _load_recorded(source, load)
    except Exception as error:  # a broken plug-in must not break every rule
        warnings.warn(
            f"cactus_theory: rule plug-in {source} was not loaded: {error}",
            RuntimeWarning,
            stacklevel=3,
        )


def _load_recorded(source: str, load: typing.Callable[[], object]) -> None:
    """Load a plug-in once and remember what it registered; a source loaded before has its
    rules registered again (its module is cached, so importing it would do nothing)."""
    if source in _LOADED:
        for kind, cls in _LOADED[source]:
            register(cls, provider=source, kind=kind)
        return
    before = {id(kind): dict(kind.registry) for kind in KINDS}
    loaded = load()
    for kind in KINDS:
        if isinstance(loaded, type) and issubclass(loaded, kind.base):
            register(loaded, provider=source, kind=kind)
    _LOADED[source] = [
        (kind, cls)
        for kind in KINDS
        for name, cls in kind.registry.items()
        if before.get(id(kind), {}).get(name) is not cls
    ]


def _env_modules() -> list[str]:
    text = os.environ.get(ENV_MODULES, "")
    return [item.strip() for item in text.split(",") if item.strip()]


def load_modules(
    modules: typing.Iterable[str], *, argument: str = "rules_module", export: bool = False
) -> list[str]:
    """Import each module (a dotted name, or a path to a ``.py`` file) so that it registers
    its rules; returns the names it added. ValueError naming ``argument`` when a module
    cannot be imported (the user asked for it by name). ``export``: also add the modules
    to ``CACTUS_RULES_MODULES`` (paths made absolute), so that child processes started
    afterwards (vLLM's engine and workers, the report's claims check) import them too."""
    modules = list(modules)
    before = {(id(kind), name) for kind in KINDS for name in kind.registry}
    for module in modules:
        try:
            _load_recorded(module, functools.partial(_import, module))
        except ValueError:
            raise
        except Exception as error:
            raise ValueError(
                f"{argument}: could not import rules module {module!r}: "
                f"{type(error).__name__}: {error}"
            ) from None
    if export and modules:
        shared = [os.path.abspath(item) if item.endswith(".py") else item for item in modules]
        present = _env_modules()
        os.environ[ENV_MODULES] = ",".join(dict.fromkeys(present + shared))
    return [name for kind in KINDS for name in kind.registry if (id(kind), name) not in before]


def _import(module: str) -> types.ModuleType:
    path = Path(module)
    if module.endswith(".py") or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(f"no file {module}")
        resolved = path.resolve()
        key = f"cactus_rules_{abs(hash(str(resolved)))}_{resolved.stem}"
        if key in sys.modules:
            return sys.modules[key]
        spec = importlib.util.spec_from_file_location(key, resolved)
        loaded = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[key] = loaded
        # The file's folder is on sys.path while it runs, so it can import a module beside
        # it (``from helpers import ...``), as ``python file.py`` would.
        folder = str(resolved.parent)
        added = folder not in sys.path
        if added:
            sys.path.insert(0, folder)
        try:
            spec.loader.exec_module(loaded)  # type: ignore[union-attr]
        except BaseException:
            del sys.modules[key]
            raise
        finally:
            if added and folder in sys.path:
                sys.path.remove(folder)
        return loaded
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        # The console script does not put the working directory on sys.path (python -m
        # does): a local module next to the user is found there.
        local = Path.cwd() / (module.replace(".", os.sep) + ".py")
        if error.name != module.split(".")[0] or not local.is_file():
            raise
        sys.path.append(str(Path.cwd()))
        return importlib.import_module(module)


# --- specs ----------------------------------------------------------------------------------


def rule_class(name: str, kind: Kind = RULES) -> type[Rule]:
    """The class registered as ``name`` (ValueError listing the names when unknown)."""
    if not isinstance(name, str):
        raise ValueError(f"name: expected a {kind.noun} name, got {type(name).__name__}")
    if name not in kind.registry:
        discover()
    if name not in kind.registry:
        if kind is RULES:
            raise ValueError(f"name: {unknown_rule_message(name)}")
        raise ValueError(f"name: unknown {kind.noun} {name!r}; choose one of {names(kind)}")
    return kind.registry[name]


def unknown_rule_message(name: str) -> str:
    """ "unknown rule 'X'", a "did you mean" when a registered name is close, the names,
    and how a rule of one's own becomes known."""
    known = names()
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    guess = f" (did you mean {' or '.join(repr(item) for item in close)}?)" if close else ""
    return (
        f"unknown rule {name!r}{guess}; registered: {', '.join(known)}. A rule of your own "
        "is known once its module is imported: --rules-module path/to/file.py (or a module "
        f"name) on any command, {ENV_MODULES} for every process, or rules.register(cls) "
        "in code"
    )


def make(name: str, **params: Any) -> Rule:
    """Create the rule ``name`` with its parameters, e.g. ``make("cactus", delta=0.5)``.

    A string value is converted to the parameter's declared type as ``parse`` converts a
    spec (``convert_params``: ``make("cactus", delta="0.5")`` is ``delta=0.5``). Raises
    ``ValueError`` for an unknown name, an unknown or missing parameter, or a bad value
    (δ < 0, α outside [0, 1], k < 1, a string that is not a number, ...).
    """
    return make_kind(RULES, name, params)


def make_kind(kind: Kind, name: str, params: dict[str, Any], where: str | None = None) -> Any:
    """``make`` for the rules of ``kind``, with the spec the parameters came from
    (``where``) for messages."""
    cls = rule_class(name, kind)
    named = {
        key: parameter
        for key, parameter in _parameters(cls).items()
        if parameter.kind
        in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    accepted = list(named)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"{unknown[0]}: not a parameter of {kind.noun} {name!r} (it takes {accepted or 'none'})"
        )
    params = convert_params(cls, params, where)
    missing = [
        key
        for key, parameter in named.items()
        if parameter.default is inspect.Parameter.empty and key not in params
    ]
    if missing:
        raise ValueError(f"{missing[0]}: {kind.noun} {name!r} needs this parameter")
    try:
        return cls(**params)
    except ValueError:
        raise
    except TypeError as error:  # a user's __init__ rejecting a value's type
        raise ValueError(f"params: {kind.noun} {name!r} rejected {params}: {error}") from None


def parameter_types(cls: type[Rule]) -> dict[str, type]:
    """The declared type of each parameter of ``cls.__init__`` (float when unannotated;
    ``X | None`` counts as X)."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # unresolvable annotations: fall back to float
        hints = {}
    declared = {}
    for key in _parameters(cls):
        hint = hints.get(key, float)
        options = [item for item in typing.get_args(hint) if item is not type(None)]
        if options and typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = options[0]
        declared[key] = hint if hint in (int, float, str, bool) else float
    return declared


def convert_params(cls: type[Rule], params: dict[str, Any], where: str | None = None) -> dict:
    """``params`` with every string value converted to its parameter's declared type
    (``parameter_types``: int, float, bool from true/false/1/0/yes/no, str kept, stripped);
    other values pass as they are. The one conversion of ``parse`` and ``make``. ValueError
    naming the parameter (and ``where``: the spec it came from) for a value that does not
    convert."""
    kinds = parameter_types(cls)
    place = f" in {where!r}" if where else ""
    converted = {}
    for key, value in params.items():
        if not isinstance(value, str):
            converted[key] = value
            continue
        kind, text = kinds.get(key, float), value.strip()
        if kind is str:
            converted[key] = text
        elif kind is bool:
            if text.lower() not in ("true", "1", "yes", "false", "0", "no"):
                raise ValueError(f"{key}: expected true or false{place}, got {value!r}")
            converted[key] = text.lower() in ("true", "1", "yes")
        else:
            try:
                converted[key] = kind(text)
            except ValueError:
                noun = "an integer" if kind is int else "a number"
                raise ValueError(f"{key}: expected {noun}{place}, got {value!r}") from None
    return converted


def parse(spec: str) -> Rule:
    """A rule from ``name`` or ``name:key=value,...``, e.g. ``parse("cactus-exact:delta=0.5")``.

    The inverse of ``spec_of``. Each value is converted to its parameter's declared type
    (``parameter_types``). A key given twice is an error, not "last one wins". Names are
    looked up in the registry only: a spec never imports anything.
    """
    return parse_kind(RULES, spec)


def parse_kind(kind: Kind, spec: str) -> Any:
    """``parse`` for the rules of ``kind``."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"spec: expected 'name' or 'name:key=value,...', got {spec!r}")
    name, _, rest = spec.partition(":")
    cls = rule_class(name.strip(), kind)
    whole = getattr(cls, "spec_rest", None)
    if whole is not None:  # the rest of the spec is one parameter's value
        return make_kind(kind, name.strip(), {whole: rest.strip()} if rest.strip() else {})
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"spec: expected key=value in {spec!r}, got {item!r}")
        if key in params:
            raise ValueError(f"{key}: given twice in {spec!r}")
        params[key] = value
    return make_kind(kind, name.strip(), params, spec)


def spec_of(rule: Rule) -> str:
    """The string ``parse`` accepts for ``rule``, e.g. ``"cactus:delta=0.5"``."""
    params = rule.params()
    whole = getattr(rule, "spec_rest", None)
    if whole is not None:
        return rule.name + ":" + str(params[whole])
    if not params:
        return rule.name
    return rule.name + ":" + ",".join(f"{key}={value}" for key, value in params.items())


_register_builtins()
