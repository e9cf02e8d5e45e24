"""What a generate call returns (``DecodeResult``) and the per-row record it is built from
(``Progress``: committed tokens, their KL and TV, which rows have finished), plus
``StepLog``, the per-step accepted drafts and draft counts of every original row, and
``Stream``, which feeds a streamer the columns of generated tokens as ``generate()`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cactus_theory.decode.settings import Prepared

Tensor = torch.Tensor


@dataclass
class DecodeResult:
    """What a generate call returns.

    sequences: [B, P + T] the prompts (as given, left-padded) followed by the generated
    tokens, finished rows padded with ``pad_token_id`` (T = the longest generation).
    num_generated: [B] tokens generated per row (EOS included). accepted_lengths:
    [steps, B] accepted drafts per verify step per row (−1 where the row was not active;
    empty for the baseline); draft_counts: [steps, B] the drafts k_b each row verified.
    token_kl, token_tv: [B, T] float64 KL(μ_t ‖ q_t) and TV(μ_t, q_t) of every generated
    token (0 for bonus and plain tokens and past num_generated; None when the meter is
    off); ``sequence_kl`` and ``sequence_tv`` are their per-row sums (``meter`` says what
    they estimate). timing: seconds (``total``, ``prefill``, ``draft``, ``verify``,
    ``sampler``, ``meter``) and counts (``verifier_calls``, ``draft_calls``).
    eos_token_id, pad_token_id: the ids used (after the generation-config defaults).
    Tree decoding (``tree=``): draft_counts holds the nodes each row drafted, and
    tree_outcomes, tree_children [steps, B, D] the walk at each depth: the rank of the
    accepted child or the number of children when all were rejected (−1 where the walk did
    not reach a node with children), and that node's number of children (0 there); None
    for chains.
    """

    sequences: Tensor
    prompt_length: int
    num_generated: Tensor
    accepted_lengths: Tensor
    draft_counts: Tensor
    token_kl: Tensor | None = None
    token_tv: Tensor | None = None
    timing: dict = field(default_factory=dict)
    eos_token_id: list[int] = field(default_factory=list)
    pad_token_id: int = 0
    tree_outcomes: Tensor | None = None
    tree_children: Tensor | None = None

    @property
    def new_tokens(self) -> list[list[int]]:
        """The generated tokens of each row (without padding)."""
        ends = self.num_generated.tolist()
        rows = self.sequences[:, self.prompt_length :].tolist()
        return [row[:end] for row, end in zip(rows, ends, strict=True)]

    @property
    def total_tokens(self) -> int:
        return int(self.num_generated.sum())

    @property
    def tokens_per_second(self) -> float:
        return self.total_tokens / max(self.timing.get("total", 0.0), 1e-12)

    @property
    def mean_accepted(self) -> float:
        """Mean accepted drafts per verify step (over active rows)."""
        valid = self.accepted_lengths[self.accepted_lengths >= 0]
        return float(valid.float().mean()) if valid.numel() else 0.0

    @property
    def acceptance_length(self) -> float:
        """AL as in the paper: mean accepted drafts per verify step (bonus token excluded)."""
        return self.mean_accepted

    @property
    def steps(self) -> int:
        """Verify steps over all rows (a step of a row that was active)."""
        return int((self.accepted_lengths >= 0).sum())

    @property
    def reached_by_position(self) -> list[int]:
        """n_j for draft positions j = 1..k_max: the verify steps that reached draft j (at
        least j drafts, the first j − 1 accepted). For a tree, depth j: the steps whose walk
        reached a node with children at depth j − 1."""
        if self.tree_outcomes is not None:
            return [int(value) for value in (self.tree_outcomes >= 0).sum(dim=(0, 1)).tolist()]
        active = self.accepted_lengths >= 0  # [steps, B]
        k_max = int(self.draft_counts[active].max()) if bool(active.any()) else 0
        return [
            int((active & (self.draft_counts >= j) & (self.accepted_lengths >= j - 1)).sum())
            for j in range(1, k_max + 1)
        ]

    @property
    def alpha_by_position(self) -> list[float]:
        """α_j for draft positions j = 1..k_max: of the n_j steps that reached draft j
        (``reached_by_position``), the share that accepted it, (#accepted >= j) / n_j;
        NaN where no step reached j. Its standard error is sqrt(α_j (1 − α_j) / n_j)
        if steps were independent."""
        reached = self.reached_by_position
        if self.tree_outcomes is not None:
            taken = (self.tree_outcomes >= 0) & (self.tree_outcomes < self.tree_children)
            return [
                int(count) / total if total else float("nan")
                for count, total in zip(taken.sum(dim=(0, 1)).tolist(), reached, strict=True)
            ]
        active = self.accepted_lengths >= 0
        alphas = []
        for j, count in enumerate(reached, start=1):
            taken = int((active & (self.draft_counts >= j) & (self.accepted_lengths >= j)).sum())
            alphas.append(taken / count if count else float("nan"))
        return alphas

    @property
    def ends_by_rank(self) -> tuple[list[list[int]], list[list[int]]]:
        """(ended [D][R], reached [D][R]) of a tree run: at depth d, the walks that ended at
        the child of rank r, and those that reached a node there with more than r children
        (``tree_stats.rank_counts``); empty lists for a chain."""
        from cactus_theory.decode.tree_stats import rank_counts

        if self.tree_outcomes is None:
            return [], []
        return rank_counts(self.tree_outcomes, self.tree_children)

    @property
    def tokens_per_call(self) -> float:
        """Tokens emitted per verifier call: AL + 1 (the residual or bonus token)."""
        return 1.0 + self.mean_accepted

    @property
    def sequence_kl(self) -> Tensor | None:
        """[B] Σ_t KL(μ_t ‖ q_t) per row (nats)."""
        return None if self.token_kl is None else self.token_kl.sum(dim=1)

    @property
    def sequence_tv(self) -> Tensor | None:
        """[B] Σ_t TV(μ_t, q_t) per row."""
        return None if self.token_tv is None else self.token_tv.sum(dim=1)

    @property
    def kl_per_token(self) -> float | None:
        """Σ over rows of sequence_kl / Σ num_generated: nats per generated token."""
        if self.token_kl is None:
            return None
        return float(self.token_kl.sum()) / max(self.total_tokens, 1)


class Progress:
    """Per original row: committed tokens, their KL and TV, and whether it has finished."""

    def __init__(
        self, batch: int, max_new_tokens: int, eos: list[int], metered: bool, stopping=None
    ) -> None:
        self.generated: list[list[int]] = [[] for _ in range(batch)]
        self.kl: list[list[float]] | None = [[] for _ in range(batch)] if metered else None
        self.tv: list[list[float]] | None = [[] for _ in range(batch)] if metered else None
        self.finished = [max_new_tokens == 0] * batch
        self.max_new_tokens = max_new_tokens
        self.eos = set(eos)
        self.stopping = stopping  # (row, generated) -> bool (``settings`` docstring)

    @classmethod
    def of(cls, prepared: Prepared) -> Progress:
        return cls(
            prepared.batch, prepared.max_new_tokens, prepared.eos, prepared.meter,
            prepared.stopping,
        )  # fmt: skip

    def remaining(self, row: int) -> int:
        return self.max_new_tokens - len(self.generated[row])

    def commit(self, row: int, tokens: list[int], kl: list[float], tv: list[float]) -> int:
        """Append tokens left to right until EOS, the budget or the stopping hook; returns
        how many were kept."""
        kept = 0
        for token in tokens:
            if self.finished[row]:
                break
            self.generated[row].append(token)
            if self.kl is not None:
                self.kl[row].append(kl[kept])
                self.tv[row].append(tv[kept])
            kept += 1
            if token in self.eos or self.remaining(row) == 0:
                self.finished[row] = True
            elif self.stopping is not None:
                self.finished[row] = bool(self.stopping(row, self.generated[row]))
        return kept

    def result(
        self,
        prepared: Prepared,
        accepted: Tensor,
        drafts: Tensor,
        timing: dict,
        tree: tuple[Tensor, Tensor] | None = None,
    ) -> DecodeResult:
        """The ``DecodeResult`` of the committed tokens, with the step logs ``accepted`` and
        ``drafts`` [steps, B] (and a tree run's outcomes and children [steps, B, D])."""
        longest = max((len(tokens) for tokens in self.generated), default=0)
        rows = len(self.generated)

        def padded(values: list[list], fill, dtype) -> Tensor:
            table = [row + [fill] * (longest - len(row)) for row in values]
            return torch.tensor(table, dtype=dtype).reshape(rows, longest)

        new = padded(self.generated, prepared.pad_id, torch.int64)  # [B, T]
        return DecodeResult(
            sequences=torch.cat([prepared.input_ids.cpu(), new], dim=1),
            prompt_length=prepared.input_ids.shape[1],
            num_generated=torch.tensor([len(tokens) for tokens in self.generated]),
            accepted_lengths=accepted,
            draft_counts=drafts,
            token_kl=None if self.kl is None else padded(self.kl, 0.0, torch.float64),
            token_tv=None if self.tv is None else padded(self.tv, 0.0, torch.float64),
            timing=timing,
            eos_token_id=sorted(self.eos),
            pad_token_id=prepared.pad_id,
            tree_outcomes=None if tree is None else tree[0],
            tree_children=None if tree is None else tree[1],
        )


class StepLog:
    """Per verify step, each original row's accepted drafts and drafts k_b (−1 for rows no
    longer decoding): ``DecodeResult.accepted_lengths`` and ``draft_counts`` [steps, B]."""

    def __init__(self, batch: int, levels: int = 0) -> None:
        self.batch = batch
        self.levels = levels  # D of a tree run (its per-depth logs), 0 for a chain
        self.accepted: list[Tensor] = []  # per step, [B]
        self.drafts: list[Tensor] = []  # per step, [B]
        self.outcomes: list[Tensor] = []  # per step of a tree run, [B, D]
        self.children: list[Tensor] = []  # per step of a tree run, [B, D]

    def record(self, rows: Tensor, accepted: Tensor, num_drafts: Tensor) -> None:
        """One step of the active rows (original indices ``rows`` [A]; values [A])."""
        self.accepted.append(self._placed(rows, accepted))
        self.drafts.append(self._placed(rows, num_drafts))

    def record_tree(self, rows: Tensor, outcomes: Tensor, children: Tensor) -> None:
        """A tree step's walk of the active rows (``outcomes``, ``children`` [A, d], d <= D)."""
        for log, values, fill in ((self.outcomes, outcomes, -1), (self.children, children, 0)):
            placed = torch.full((self.batch, self.levels), fill, dtype=torch.int64)
            placed[rows.cpu(), : values.shape[1]] = values.cpu()
            log.append(placed)

    def tree(self) -> tuple[Tensor, Tensor] | None:
        """(outcomes, children) [steps, B, D] of a tree run; None for a chain."""
        if not self.levels:
            return None
        if not self.outcomes:
            empty = torch.zeros(0, self.batch, self.levels, dtype=torch.int64)
            return empty, empty
        return torch.stack(self.outcomes), torch.stack(self.children)

    @property
    def verifier_calls(self) -> int:
        return len(self.accepted)

    def _placed(self, rows: Tensor, values: Tensor) -> Tensor:
        placed = torch.full((self.batch,), -1, dtype=torch.int64)
        placed[rows.cpu()] = values.cpu()
        return placed

    def stacked(self) -> tuple[Tensor, Tensor]:
        """(accepted [steps, B], drafts [steps, B]); [0, B] when no step ran."""
        if not self.accepted:
            empty = torch.zeros(0, self.batch, dtype=torch.int64)
            return empty, empty
        return torch.stack(self.accepted), torch.stack(self.drafts)


class Stream:
    """Feeds ``streamer`` (``put``, ``end``) what ``generate()`` would: the prompts [B, P],
    then each generated column [B] as soon as every unfinished row has reached it (rows
    that have finished contribute ``pad_id``), then ``end()``. With ``streamer`` None
    every call does nothing."""

    def __init__(self, streamer, prepared: Prepared) -> None:
        self.streamer = streamer
        self.pad_id = prepared.pad_id
        self.sent = 0  # columns already put
        if streamer is not None:
            streamer.put(prepared.input_ids.cpu())

    def push(self, progress: Progress) -> None:
        """Put every column that all unfinished rows have reached."""
        if self.streamer is None:
            return
        lengths = [len(tokens) for tokens in progress.generated]
        open_lengths = [n for n, done in zip(lengths, progress.finished, strict=True) if not done]
        ready = min(open_lengths) if open_lengths else max(lengths, default=0)
        for column in range(self.sent, ready):
            values = [t[column] if column < len(t) else self.pad_id for t in progress.generated]
            self.streamer.put(torch.tensor(values, dtype=torch.int64))  # [B]
        self.sent = max(self.sent, ready)

    def end(self, progress: Progress) -> None:
        """Put the remaining columns, then ``end()``."""
        if self.streamer is None:
            return
        self.push(progress)
        self.streamer.end()
