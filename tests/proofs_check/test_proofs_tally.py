"""``claims.Worst``: the tally of a violation measure and its smallest counterexample."""

import numpy as np

from proofs_check.claims import Worst


def test_worst_update_each_is_update_row_by_row():
    rng = np.random.default_rng(3)
    values = rng.normal(size=40)
    values[5] = np.nan
    violated = values > 1.0
    vocabs = rng.integers(2, 9, size=40)
    one, each = Worst(), Worst()
    for index in range(40):
        one.update(
            [values[index]], [violated[index]], int(vocabs[index]), lambda i, k=index: {"k": k}
        )
    each.update_each(values, violated, vocabs, lambda k: {"k": k})
    assert (each.value, each.count, each.violations) == (one.value, one.count, one.violations)
    assert each.counterexample == one.counterexample and each.counterexample is not None
