"""Every code block of README.md and docs/*.md runs as written (``docs_blocks`` says how:
python executed page by page, bash commands parsed by the CLI's own parsers or run, with
markers for a file, a stand-in, a run or a stated skip). One item per block, named
``page:line``."""

import pytest
from docs_blocks import PAGES, Page, blocks, run_block

from cactus_theory.core.rules import registry

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ITEMS = [(page, index) for page in PAGES for index in range(len(blocks(page)))]


@pytest.fixture(scope="module")
def pages():
    """The pages run so far (their folders and namespaces), closed at the end."""
    runs: dict[str, Page] = {}
    yield runs
    for page in runs.values():
        page.close()


@pytest.mark.parametrize(
    ("page_name", "index"),
    ITEMS,
    ids=[f"{page}:{blocks(page)[index].line}" for page, index in ITEMS],
)
def test_block(page_name, index, pages, tmp_path_factory, monkeypatch):
    every = blocks(page_name)
    block = every[index]
    if block.action == "skip":
        assert len(block.marker) > 1, f"{block.where}: a skip must say what the block needs"
        pytest.skip(f"{block.where}: {block.marker[1]}")
    if page_name not in pages:
        registry.discover()  # the plug-ins first, so that closing the page keeps them
        folder = tmp_path_factory.mktemp(page_name.replace("/", "-"))
        pages[page_name] = Page(page_name, folder, {"__name__": "docs"}, 0, dict(registry.REGISTRY))
    page = pages[page_name]
    monkeypatch.chdir(page.folder)
    monkeypatch.syspath_prepend(str(page.folder))
    monkeypatch.delenv(registry.ENV_MODULES, raising=False)  # restored after --rules-module
    for earlier in every[page.done : index]:  # a block sees what the page defined before it
        if earlier.action != "skip":
            run_block(earlier, page, monkeypatch)
    run_block(block, page, monkeypatch)
    page.done = index + 1


def test_every_page_has_its_blocks_found():
    """The fence pattern finds as many blocks as the pages have fences (an odd count, or a
    fence the pattern misses, fails here instead of going untested)."""
    from docs_blocks import ROOT

    for page in PAGES:
        fences = [line for line in (ROOT / page).read_text().splitlines() if line.startswith("```")]
        assert len(fences) == 2 * len(blocks(page)), page


def test_a_block_without_a_language_or_with_an_unknown_command_fails(tmp_path, monkeypatch):
    """Negative controls: what the runner must refuse."""
    from docs_blocks import Block

    page = Page("x.md", tmp_path)
    with pytest.raises(AssertionError, match="fence language ''"):
        run_block(Block("x.md", 1, "", "print(1)\n"), page, monkeypatch)
    with pytest.raises(AssertionError, match="no rule for the command 'curl"):
        run_block(Block("x.md", 1, "bash", "curl example.org\n"), page, monkeypatch)
    unknown_flag = "(?s)cactus decode --nope: .*unrecognized arguments: --nope"
    with pytest.raises(AssertionError, match=unknown_flag):
        run_block(Block("x.md", 1, "bash", "cactus decode --nope\n"), page, monkeypatch)
    with pytest.raises(AssertionError, match="cactus bench nope: no such command"):
        run_block(Block("x.md", 1, "bash", "cactus bench law|nope\n"), page, monkeypatch)
    with pytest.raises(AssertionError, match="cactus decode: no flag --nope"):
        run_block(Block("x.md", 1, "bash", "cactus decode [--nope] DIR\n"), page, monkeypatch)
    with pytest.raises(NameError):
        run_block(Block("x.md", 1, "python", "undefined_name\n"), page, monkeypatch)
