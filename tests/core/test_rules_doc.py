"""docs/rules.md's worked example ("Write your own rule"): its rule module stays short.
Every block of the page (the module, its checks, its commands) runs in ``tests/test_docs.py``."""

from docs_blocks import code_blocks


def test_the_example_rule_is_at_most_30_lines_of_code():
    code = [
        line
        for line in code_blocks("docs/rules.md", "python")[0].splitlines()
        if line.strip() and not line.strip().startswith(("#", '"""'))
    ]
    assert len(code) <= 30, len(code)
