"""One row router for both of vLLM's accept steps (V1's and Model Runner V2's).

A verify step of B request rows goes through three stages, the same in either runner:

1. ``route``: each row's spec from the model runner's batch context
   (``config.current_specs``); greedy rows (temperature 0) and rows whose spec is
   ``"vllm"`` go to vLLM's own function (spec ``None``);
2. ``verify_groups``: the rows with a rule, grouped by spec in sorted order (so the
   unseeded draws come from the default generator in a fixed order), each group verified
   by the runner's ``verify_group(rule, rows)`` (which gathers the runner's layout, calls
   ``accept.accept_flat`` and writes the group's output), and recorded in ``metrics``;
3. ``record_vllm_rows``: the drafted rows vLLM's own function verified, recorded as
   ``"vllm"`` (or ``"vllm-greedy"`` when every such row was greedy), without KL.

The runners differ only in their layouts (``accept.rejection_sample``: V1's flattened
rows; ``runner_v2.rejection_sample``: V2's logits rows and request-state tensors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cactus_theory.core.rules.base import Rule
from cactus_theory.vllm import config, metrics

if TYPE_CHECKING:  # pragma: no cover
    from cactus_theory.vllm.accept import FlatResult

#: Recorded spec of rows verified by vLLM's own function when all of them were greedy.
VLLM_GREEDY = "vllm-greedy"


@dataclass(frozen=True)
class Routing:
    """Where each of the B rows of one verify step goes.

    specs : per row, its rule spec, or None for vLLM's own function.
    greedy : per row, whether vLLM samples it greedily (temperature 0).
    num_drafts : per row, the drafts the runner gave it (rows with 0 are not recorded).
    """

    specs: tuple[str | None, ...]
    greedy: tuple[bool, ...]
    num_drafts: tuple[int, ...]

    @property
    def ours(self) -> list[int]:
        """Rows verified by a rule of this project."""
        return [b for b, spec in enumerate(self.specs) if spec is not None]

    @property
    def theirs(self) -> list[int]:
        """Rows verified by vLLM's own function."""
        return [b for b, spec in enumerate(self.specs) if spec is None]

    def groups(self) -> Iterator[tuple[str, Rule, list[int]]]:
        """(spec, rule, rows) per spec of ``ours``, specs in sorted order."""
        for spec in sorted({spec for spec in self.specs if spec is not None}):
            rows = [b for b, row_spec in enumerate(self.specs) if row_spec == spec]
            yield spec, config.parse_spec(spec), rows


def route(greedy: Sequence[bool], num_drafts: Sequence[int]) -> Routing:
    """The routing of a verify step of ``len(greedy)`` rows (``config.current_specs``)."""
    if len(greedy) != len(num_drafts):
        raise ValueError("num_drafts: expected one count per row of greedy")
    specs = config.current_specs(len(greedy))
    kept = tuple(None if is_greedy else spec for spec, is_greedy in zip(specs, greedy, strict=True))
    return Routing(kept, tuple(bool(g) for g in greedy), tuple(int(n) for n in num_drafts))


def verify_groups(
    routing: Routing,
    verify_group: Callable[[Rule, list[int]], FlatResult],
    meter: bool,
) -> None:
    """Verify each group of ``routing`` with ``verify_group(rule, rows)`` (which writes its
    output) and record its drafted rows under its spec (KL only when ``meter``)."""
    record = metrics.recorder()
    for spec, rule, rows in routing.groups():
        result = verify_group(rule, rows)
        drafted = [slot for slot, b in enumerate(rows) if routing.num_drafts[b] > 0]
        if drafted:
            record.add(
                spec,
                drafts=result.num_drafts[drafted].tolist(),
                accepted=result.num_accepted[drafted].tolist(),
                kl=result.kl[drafted].tolist() if meter else None,
            )


def record_vllm_rows(routing: Routing, accepted: Callable[[list[int]], list[int]]) -> None:
    """Record the drafted rows of vLLM's own function; ``accepted(rows)`` gives their
    accepted drafts (read from vLLM's output)."""
    rows = [b for b in routing.theirs if routing.num_drafts[b] > 0]
    if not rows:
        return
    metrics.recorder().add(
        VLLM_GREEDY if all(routing.greedy[b] for b in rows) else config.VLLM_SPEC,
        drafts=[routing.num_drafts[b] for b in rows],
        accepted=accepted(rows),
        kl=None,
    )
