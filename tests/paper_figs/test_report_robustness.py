"""``cactus report`` as a long job: killed any way, it leaves no claims child running; one
writer per output folder; damaged caches are recomputed; the page works offline.

The kill tests run the real job (``report.build`` on the tiny sweep, the quick claims
check in its child process) in a subprocess and find the child through /proc (Linux).
"""

import html.parser
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from report_fixtures import fake_claims, fake_real_model

from cactus_theory.util import process
from paper_figs import report
from sims import sweep

ROOT = Path(__file__).resolve().parents[2]
JOB = """
import sys
from paper_figs import report
from sims import sweep
{patch}
report.build(
    sys.argv[1], quick=True, seed=0, progress=False, config=sweep.TINY, real_model=False,
    conformance=False,
)
"""
linux_only = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")


def claims_children(out: Path) -> list[int]:
    """Pids of live ``python -m proofs_check`` processes writing into ``out``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if state != "Z" and b"proofs_check" in words and str(out).encode() in b" ".join(words):
            found.append(int(entry.name))
    return found


def wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def lock_is_free(out: Path) -> bool:
    """Whether a rerun could take ``out``'s lock now (it is released at once)."""
    try:
        with process.exclusive_lock(out):
            return True
    except ValueError:
        return False


def start_job(out: Path, patch: str = "") -> subprocess.Popen:
    """The job in a subprocess, once its claims child runs."""
    job = subprocess.Popen(
        [sys.executable, "-c", JOB.format(patch=patch), str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "CACTUS_CACHE": str(out.parent / "cache")},
    )
    assert wait_for(lambda: claims_children(out), 60), job.stderr.read().decode()[-2000:]
    return job


@linux_only
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_killing_the_job_stops_the_claims_child(tmp_path, signum):
    out = tmp_path / "out"
    job = start_job(out)
    (child,) = claims_children(out)
    job.send_signal(signum)
    job.wait(30)
    assert job.returncode != 0
    # SIGTERM and SIGHUP stop the child in the job's cleanup; after SIGKILL the child sees
    # its parent die (PR_SET_PDEATHSIG, or the watchdog within half a second).
    assert wait_for(lambda: not claims_children(out), 30), f"child {child} still runs"
    # The folder is free again: a rerun may start (it is not run to the end here). A dying
    # child leaves /proc's command line before the kernel closes its files (the inherited
    # lock), so the lock is freed a moment after the child disappears from the list above.
    assert wait_for(lambda: lock_is_free(out), 10), "the output folder stays locked"


@linux_only
def test_a_second_writer_of_the_same_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    job = start_job(out)
    try:
        with pytest.raises(ValueError, match="^out: another run is writing to"):
            report.build(
                out,
                quick=True,
                seed=0,
                progress=False,
                config=sweep.TINY,
                real_model=False,
                conformance=False,
            )
    finally:
        job.kill()
        job.wait(30)
    assert wait_for(lambda: not claims_children(out), 10)


@linux_only
def test_negative_control_an_unwatched_child_outlives_its_parent(tmp_path):
    """With the child not told its parent (``child_environment`` bypassed) it survives the
    job's SIGKILL: the property the kill test checks comes from ``exit_with_parent``."""
    out = tmp_path / "out"
    job = start_job(
        out,
        "from paper_figs import children\n"
        "children.child_environment = lambda: dict(__import__('os').environ)",
    )
    job.kill()
    job.wait(30)
    try:
        assert not wait_for(lambda: not claims_children(out), 3)
    finally:
        for pid in claims_children(out):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "damage",
    ["", "{not json", "[]", '{"kind": "tradeoff"}', "OTHER"],
    ids=["empty", "truncated", "list", "partial-record", "another-cells-record"],
)
def test_a_damaged_or_wrong_shaped_cell_is_recomputed(tmp_path, damage):
    first = sweep.run(sweep.TINY, tmp_path, progress=False)
    cells = sorted((tmp_path / "cells" / "tradeoff").glob("*.json"))
    victim, other = cells[0], cells[1]
    victim.write_text(other.read_text() if damage == "OTHER" else damage)
    again = sweep.run(sweep.TINY, tmp_path, progress=False)
    assert again.computed == 1
    assert [value for _, value in again.cells] == [value for _, value in first.cells]
    assert json.loads(victim.read_text())["key"] == victim.stem


@pytest.mark.parametrize(
    "damage",
    [
        "",
        '{"check": "overshoot"',
        "[1, 2]",
        '{"check": "cor5", "result": {"rows": []}}',
        '{"check": "overshoot", "result": {"rows": [{"id": "x"}]}}',
    ],
    ids=["empty", "truncated", "list", "another-check", "rows-without-keys"],
)
def test_a_damaged_claims_cache_file_is_recomputed(tmp_path, damage):
    from proofs_check import runner

    only = ("overshoot",)
    first = runner.run(quick=True, seed=0, progress=False, cache_dir=str(tmp_path), only=only)
    (path,) = runner.cache_folder(tmp_path, quick=True, seed=0).glob("*.json")
    path.write_text(damage)
    again = runner.run(quick=True, seed=0, progress=False, cache_dir=str(tmp_path), only=only)
    assert again["claims"] == first["claims"]
    assert runner.load_cached(path, "overshoot") is not None  # rewritten


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.links.append(value)


def test_the_page_renders_from_its_folder_alone(tmp_path):
    """Every src/href is a relative path to a file in the output folder or an anchor on
    the page: moving the folder keeps the page whole, and nothing is fetched."""
    out = tmp_path / "out"
    built = report.build(
        out,
        seed=0,
        progress=False,
        config=sweep.TINY,
        claims_runner=fake_claims,
        real_model=fake_real_model,
    )
    moved = tmp_path / "moved"
    out.rename(moved)
    parser = _Links()
    page = (moved / built.html.name).read_text(encoding="utf-8")
    parser.feed(page)
    anchors = {
        f"#{name}" for name in ("summary", "real-model", "figures", "simulation", "claims", "data")
    }
    assert parser.links
    for link in parser.links:
        assert "://" not in link and not link.startswith("/"), link
        if link.startswith("#"):
            assert f"id='{link[1:]}'" in page, link
        else:
            assert (moved / link).is_file(), link
    assert anchors <= set(parser.links)
    # The claims table shows readable text, never raw JSON escapes.
    assert "\\u" not in page and "{&quot;" not in page
