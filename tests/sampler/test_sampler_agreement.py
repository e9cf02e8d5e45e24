"""The torch sampler makes the numpy reference's decisions from the same uniforms.

Oracle: ``cactus_theory.verify.verify_block`` (float64), run on the very inputs torch sees
(float32 inputs are rounded first and handed to numpy as float64). float64 inputs must give
identical tokens. float32 inputs must too, except at near-ties: a decision whose uniform
lies within ``NEAR`` of the reference acceptance, or an inverse-CDF draw whose threshold
lies within ``NEAR`` (relative) of a cumulative boundary. Those have measure ~1e-5 per
event; the test counts them, bounds their number and requires everything else to match.
"""

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from cactus_theory import divergences, rules, sampler
from cactus_theory.core import gamma, validate
from cactus_theory.core import verify as reference
from cactus_theory.core.rules.frontier import frontier_constants
from cactus_theory.sampler import emit, verify_step
from cactus_theory.sampler import gamma as torch_gamma
from cactus_theory.sampler.rules import frontier as torch_frontier
from cactus_theory.sampler.rules import frontier_binned, frontier_sorted
from cactus_theory.testing.strategies import pairs, positive_budgets

RULE_SPECS = [
    "sps",
    "cactus:delta=0.5",
    "cactus:delta=0",
    "cactus-exact:delta=0.5",
    "cactus-exact:delta=0.05,divergence=reverse-kl",
    "cactus-exact:delta=0.1,divergence=js",
    "cactus-exact:delta=0.2,divergence=chi2",
    "cactus-exact:delta=0.2,divergence=hellinger",
    "cactus-exact:delta=0.1,divergence=tv",
    "frontier:delta=0.2",
    "frontier:delta=0",
    "pareto:spread=1.5",
    "pareto:spread=0",
    "interp:alpha=0.3",
    "tas",
    "topk:k=3",
    "greedy",
]
NEAR = 1e-5
#: scripts/gpu_check.sh sets CACTUS_TEST_DEVICE=cuda to run these on the GPU.
DEVICE = torch.device(os.environ.get("CACTUS_TEST_DEVICE", "cpu"))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_block(seed, batch=1500, steps=4, vocab=16, dtype=torch.float64):
    """Sparse-ish Dirichlet rows (some exact zeros), drafts sampled from the draft rows."""
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.full(vocab, 0.4), size=(batch, steps + 1))
    draft = rng.dirichlet(np.full(vocab, 0.4), size=(batch, steps))
    target[target < 0.01] = 0.0
    draft[draft < 0.005] = 0.0
    target /= target.sum(-1, keepdims=True)
    draft /= draft.sum(-1, keepdims=True)
    target_t = torch.tensor(target, dtype=dtype, device=DEVICE)
    draft_t = torch.tensor(draft, dtype=dtype, device=DEVICE)
    draft64 = draft_t.double().cpu().numpy()
    cumulative = np.cumsum(draft64 / draft64.sum(-1, keepdims=True), axis=-1)
    ids = (cumulative <= rng.random((batch, steps, 1))).sum(-1).clip(0, vocab - 1)
    accept_u = rng.random((batch, steps))
    sample_u = rng.random(batch)
    return target_t, draft_t, ids, accept_u, sample_u


def reference_details(rule, target, draft, ids, accept_u, sample_u):
    """The numpy reference's tokens plus the quantities that define near-ties."""
    target64 = validate.distribution("target_probs", target)
    draft64 = validate.distribution("draft_probs", draft)
    tokens, accepted = reference.verify_block(rule, target64, draft64, ids, accept_u, sample_u)
    steps = ids.shape[1]
    accept = rule.accept_probs(target64[:, :steps], draft64)
    drafted = np.take_along_axis(accept, ids[..., None], axis=-1)[..., 0]
    # A decision is a near-tie if it was scanned (no earlier rejection) and u is close to a.
    scanned = np.arange(steps)[None, :] <= accepted[:, None]
    decision_tie = (np.abs(accept_u - drafted) <= NEAR) & scanned
    rows = np.arange(len(ids))
    stop = np.minimum(accepted, steps - 1)
    law = target64[rows, accepted].copy() if steps else target64[:, 0].copy()
    rejected = accepted < steps
    if rejected.any():
        where = rows[rejected]
        law[where] = rule.residuals_for(
            target64[where, stop[where]], draft64[where, stop[where]], ids[where, stop[where]]
        )
    cumulative = np.cumsum(law, axis=-1)
    threshold = sample_u * cumulative[:, -1]
    sample_tie = (
        np.min(np.abs(cumulative - threshold[:, None]), axis=-1) <= NEAR * cumulative[:, -1]
    )
    return tokens, accepted, decision_tie.any(axis=1), sample_tie


def use_two_level(monkeypatch, block=4):
    """Force the two-level inverse CDF (blocks of ``block`` tokens) on small rows: on CPU
    the row-by-row emission of ``verify_step._emit_rows``."""
    monkeypatch.setattr(emit, "BLOCK", block)
    monkeypatch.setattr(emit, "TWO_LEVEL_MIN_VOCAB", 0)


SAMPLINGS = ["one-level", "two-level"]


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("per_position", [False, True], ids=["whole-block", "per-position"])
@pytest.mark.parametrize("spec", RULE_SPECS)
def test_float64_inputs_give_identical_tokens(spec, per_position, sampling, monkeypatch):
    # Small blocks are evaluated in one call; larger ones position by position on the rows
    # still running (verify_step.WHOLE_BLOCK_ELEMENTS). Both must make the reference's
    # decisions, with either inverse CDF (one cumulative sum, or block sums then a block).
    if per_position:
        monkeypatch.setattr(verify_step, "WHOLE_BLOCK_ELEMENTS", 0)
    if sampling == "two-level":
        use_two_level(monkeypatch, block=5)  # V = 16: three full blocks and a short one
    rule = rules.parse(spec)
    target, draft, ids, accept_u, sample_u = random_block(seed=1)
    tokens, accepted = sampler.verify(
        target,
        draft,
        torch.tensor(ids, device=DEVICE),
        rule,
        uniforms=(torch.tensor(accept_u), torch.tensor(sample_u)),
    )
    ref_tokens, ref_accepted, _, _ = reference_details(
        rule, target.cpu().numpy(), draft.cpu().numpy(), ids, accept_u, sample_u
    )
    np.testing.assert_array_equal(accepted.cpu().numpy(), ref_accepted)
    np.testing.assert_array_equal(tokens.cpu().numpy(), ref_tokens)


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("spec", RULE_SPECS)
def test_float32_inputs_agree_except_counted_near_ties(spec, sampling, monkeypatch):
    if sampling == "two-level":
        use_two_level(monkeypatch)
    rule = rules.parse(spec)
    target, draft, ids, accept_u, sample_u = random_block(seed=2, dtype=torch.float32)
    uniforms = (torch.tensor(accept_u), torch.tensor(sample_u))
    tokens, accepted = sampler.verify(
        target, draft, torch.tensor(ids, device=DEVICE), rule, uniforms=uniforms
    )
    ref_tokens, ref_accepted, decision_tie, sample_tie = reference_details(
        rule, target.double().cpu().numpy(), draft.double().cpu().numpy(), ids, accept_u, sample_u
    )
    clean = ~decision_tie
    np.testing.assert_array_equal(accepted.cpu().numpy()[clean], ref_accepted[clean])
    clean_tokens = clean & ~sample_tie
    np.testing.assert_array_equal(tokens.cpu().numpy()[clean_tokens], ref_tokens[clean_tokens])
    excluded = int((~clean_tokens).sum())
    # Expected about (k + 1) x 2 NEAR = 1e-4 per row for the continuous rules (decision
    # rules compare masses with thresholds instead, with ties of the same order): far
    # below 1% of the rows.
    assert excluded <= 0.01 * len(ids), f"{excluded} near-ties out of {len(ids)} rows"


@pytest.mark.parametrize("spec", RULE_SPECS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_are_computed_in_float32(spec, dtype):
    """bfloat16/float16 rows give bit-identical output to the same rows upcast to float32."""
    rule = rules.parse(spec)
    target, draft, ids, accept_u, sample_u = random_block(seed=3, batch=600)
    target, draft = target.to(dtype), draft.to(dtype)
    uniforms = (torch.tensor(accept_u), torch.tensor(sample_u))
    low = sampler.verify(target, draft, torch.tensor(ids, device=DEVICE), rule, uniforms=uniforms)
    # the float32 copy is not renormalised, so it only passes without the sum check
    upcast = sampler.verify(
        target.float(),
        draft.float(),
        torch.tensor(ids, device=DEVICE),
        rule,
        uniforms=uniforms,
        check=False,
    )
    torch.testing.assert_close(low[0], upcast[0], rtol=0, atol=0)
    torch.testing.assert_close(low[1], upcast[1], rtol=0, atol=0)


@pytest.mark.parametrize(
    "spec",
    [
        "sps",
        "cactus:delta=1.0",
        "cactus-exact:delta=0.5",
        "frontier:delta=0.3",
        "pareto:spread=2.0",
        "interp:alpha=0.5",
    ],
)
@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_dense_reference_path_matches(spec, sampling, monkeypatch):
    if sampling == "two-level":
        use_two_level(monkeypatch)
    rule = rules.parse(spec)
    target, draft, ids, accept_u, sample_u = random_block(seed=3, batch=500, dtype=torch.float32)
    uniforms = (torch.tensor(accept_u), torch.tensor(sample_u))
    fast = sampler.verify(target, draft, torch.tensor(ids, device=DEVICE), rule, uniforms=uniforms)
    dense = sampler.verify_dense(
        target, draft, torch.tensor(ids, device=DEVICE), rule, uniforms=uniforms
    )
    torch.testing.assert_close(fast[1], dense[1], rtol=0, atol=0)
    torch.testing.assert_close(fast[0], dense[0], rtol=0, atol=0)


def test_batched_equals_one_by_one_under_a_seed():
    rule = rules.parse("cactus:delta=0.7")
    target, draft, ids, _, _ = random_block(seed=4, batch=40, dtype=torch.float32)
    ids = torch.tensor(ids, device=DEVICE)
    batched = sampler.verify(target, draft, ids, rule, generator=torch.Generator().manual_seed(7))
    generator = torch.Generator().manual_seed(7)
    singles = [
        sampler.verify(
            target[b : b + 1], draft[b : b + 1], ids[b : b + 1], rule, generator=generator
        )
        for b in range(len(ids))
    ]
    torch.testing.assert_close(batched[0], torch.cat([s[0] for s in singles]), rtol=0, atol=0)
    torch.testing.assert_close(batched[1], torch.cat([s[1] for s in singles]), rtol=0, atol=0)
    again = sampler.verify(target, draft, ids, rule, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(batched[0], again[0], rtol=0, atol=0)


def test_generator_uniforms_are_the_documented_layout():
    rule = rules.parse("sps")
    target, draft, ids, _, _ = random_block(seed=5, batch=30, dtype=torch.float64)
    drawn = torch.rand(30, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    with_generator = sampler.verify(
        target,
        draft,
        torch.tensor(ids, device=DEVICE),
        rule,
        generator=torch.Generator().manual_seed(3),
    )
    injected = sampler.verify(
        target, draft, torch.tensor(ids, device=DEVICE), rule, uniforms=(drawn[:, :4], drawn[:, 4])
    )
    torch.testing.assert_close(with_generator[0], injected[0], rtol=0, atol=0)


def test_output_layout():
    rule = rules.parse("cactus:delta=0.3")
    target, draft, ids, accept_u, sample_u = random_block(seed=6, batch=300, dtype=torch.float32)
    tokens, accepted = sampler.verify(
        target,
        draft,
        torch.tensor(ids, device=DEVICE),
        rule,
        uniforms=(torch.tensor(accept_u), torch.tensor(sample_u)),
    )
    assert tokens.dtype == torch.int64 and tokens.shape == (300, 5)
    for row, count in zip(tokens.tolist(), accepted.tolist(), strict=True):
        assert 0 <= row[count] < 16
        assert row[count + 1 :] == [-1] * (4 - count)
    kept = torch.arange(4)[None, :] < accepted[:, None]
    assert torch.equal(tokens[:, :4][kept], torch.tensor(ids, device=DEVICE)[kept])


def test_zero_drafts_only_samples_the_bonus_row():
    target = torch.tensor([[[0.2, 0.5, 0.3]]], dtype=torch.float64)
    draft = torch.zeros(1, 0, 3, dtype=torch.float64)
    ids = torch.zeros(1, 0, dtype=torch.int64)
    for u, expected in ((0.1, 0), (0.3, 1), (0.69, 1), (0.71, 2)):
        tokens, accepted = sampler.verify(
            target, draft, ids, rules.parse("sps"), uniforms=(torch.zeros(1, 0), torch.tensor([u]))
        )
        assert tokens.tolist() == [[expected]] and accepted.tolist() == [0]


# --- the scalar solvers against their numpy twins -------------------------------------------


@pytest.mark.parametrize("divergence", ["kl", "reverse-kl", "js", "chi2", "hellinger", "tv"])
@pytest.mark.parametrize("delta", [1e-4, 0.05, 0.7, 4.0])
def test_torch_gamma_matches_numpy(divergence, delta):
    rng = np.random.default_rng(8)
    target_mass = np.concatenate(
        [rng.random(2000), 10 ** rng.uniform(-12, 0, 2000), [0.0, 1.0, 1e-300, 0.5]]
    )
    cap = rng.random(target_mass.size)
    for bound in (cap, None):  # the uncapped γ* is checked against the budget below
        expected = gamma.exact_raised_mass(target_mass, delta, divergence, cap=bound)
        got = torch_gamma.exact_raised_mass(
            torch.tensor(target_mass),
            delta,
            divergence,
            None if bound is None else torch.tensor(bound),
        ).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-300)
    # Root-based γ* is feasible as computed; the closed forms may round a hair over, but
    # never further than the numpy reference's own closed form.
    over = divergences.binary(divergence, got, target_mass) - delta
    reference_over = divergences.binary(divergence, expected, target_mass) - delta
    assert np.all(over <= np.maximum(reference_over, 0.0) + 1e-15)


SEARCHES = ["dense-search", "bisection", "binned", "binned-fallback"]


def use_search(monkeypatch, search):
    """Force the segment search: every position at once, or log2(V) bisection rounds, on
    the whole sorted row; or the bracketing on binned ratios
    (``frontier_binned.solve_binned``) on rows of any length, with its exact fallback taken
    on every row (no window is kept)."""
    limit = 1 << 40 if search == "dense-search" else 0
    monkeypatch.setattr(frontier_sorted, "DENSE_SEARCH_ELEMENTS", {DEVICE.type: limit})
    if search.startswith("binned"):
        monkeypatch.setattr(torch_frontier, "BINNED_MIN_VOCAB", 0)
    if search == "binned-fallback":
        monkeypatch.setattr(frontier_binned, "BIN_MARGIN", 0)


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("delta", [0.01, 0.3, 2.0])
def test_torch_frontier_constants_match_numpy(delta, search, monkeypatch):
    use_search(monkeypatch, search)
    rng = np.random.default_rng(9)
    target = rng.dirichlet(np.full(40, 0.3), size=300)
    draft = rng.dirichlet(np.full(40, 0.3), size=300)
    target[:, :3] = 0.0
    target /= target.sum(-1, keepdims=True)
    lift, cap = frontier_constants(target, draft, delta)
    got_lift, got_cap = torch_frontier.frontier_constants(
        torch.tensor(target), torch.tensor(draft), delta
    )
    np.testing.assert_allclose(got_lift.numpy(), lift, rtol=1e-10)
    np.testing.assert_allclose(got_cap.numpy(), cap, rtol=1e-10)


@pytest.mark.parametrize("search", SEARCHES)
def test_torch_frontier_constants_match_numpy_on_edge_rows(search, monkeypatch):
    """Sparse, near-one-hot and peaked rows: the torch segment search (two searches over
    the sorted breakpoints, dense or by bisection) finds the numpy solver's segment, and
    the same root on it.

    The cap is compared to 1e-12 where it moves a mass the KL can resolve. On a near-one-hot
    row at a budget near 1e-10 the cap moves ~1e-11 of mass, and KL(h‖q) is then known only
    to ~1e-6 relative in float64, so two exact solvers that sum in different orders place
    the cap up to that apart; there h itself (what the sampler uses) must agree to 1e-15
    and both solutions must keep the budget."""

    @settings(max_examples=80)
    @given(pairs(), positive_budgets)
    def check(pair, delta):
        target, draft = pair
        lift, cap = frontier_constants(target[None], draft[None], delta)
        got_lift, got_cap = torch_frontier.frontier_constants(
            torch.tensor(target[None]), torch.tensor(draft[None]), delta
        )
        np.testing.assert_allclose(got_lift.numpy(), lift, rtol=1e-9, atol=1e-15)

        def h_of(lift_value, cap_value):  # clip(p, c_lo q, c_hi q), 0 where q = 0
            upper = np.where(target > 0, cap_value * np.where(target > 0, target, 1.0), 0.0)
            return np.clip(draft, lift_value * target, upper)

        got_h, want_h = h_of(float(got_lift[0]), float(got_cap[0])), h_of(lift[0], cap[0])
        capped_mass = float(np.where(draft > want_h, want_h, 0.0).sum())
        if capped_mass > 1e-6:
            np.testing.assert_allclose(got_cap.numpy(), cap, rtol=1e-12)
        np.testing.assert_allclose(got_h, want_h, rtol=0, atol=1e-15)
        for h in (got_h, want_h):
            assert divergences.kl(h / h.sum(), target) <= delta * (1 + 1e-9) + 1e-15

    use_search(monkeypatch, search)
    check()


def long_rows(kind, rows, vocab, rng):
    """(target, draft) float64 rows [rows, V]: Dirichlet with exact zeros in both, softmax
    of Gaussian logits with a noisy draft (the benchmark's rows), or peaked rows."""
    if kind == "dirichlet":
        target = rng.dirichlet(np.full(vocab, 0.3), size=rows)
        draft = rng.dirichlet(np.full(vocab, 0.3), size=rows)
        target[:, :50] = 0.0
        draft[:, 50:90] = 0.0
    else:
        scale = 3.0 if kind == "softmax" else 12.0
        logits = rng.normal(size=(rows, vocab)) * scale
        noisy = logits + rng.normal(size=(rows, vocab))
        target, draft = (
            np.exp(logits - logits.max(-1, keepdims=True)),
            np.exp(noisy - noisy.max(-1, keepdims=True)),
        )
    return target / target.sum(-1, keepdims=True), draft / draft.sum(-1, keepdims=True)


@pytest.mark.parametrize("bins", ["bins", "fine-bins"])
@pytest.mark.parametrize("kind", ["dirichlet", "softmax", "peaked"])
@pytest.mark.parametrize("delta", [0.02, 0.2, 1.0])
def test_binned_frontier_constants_match_numpy_on_long_rows(kind, delta, bins, monkeypatch):
    """Rows of V = 12,000 go through ``frontier_binned.solve_binned`` (no sort of the row),
    with the bin widths of rows below or above ``FINE_START_VOCAB``: the same constants as
    the numpy solver, and no row needs the exact fallback."""
    if bins == "fine-bins":
        monkeypatch.setattr(frontier_binned, "FINE_START_VOCAB", 0)
    rng = np.random.default_rng(17)
    target, draft = long_rows(kind, 4, 12_000, rng)
    fallback_rows = []
    original = frontier_sorted.solve_caps

    def counting(target_rows, *args):
        if target_rows.shape[-1] == target.shape[-1]:
            fallback_rows.append(target_rows.shape[0])
        return original(target_rows, *args)

    monkeypatch.setattr(frontier_sorted, "solve_caps", counting)
    lift, cap = frontier_constants(target, draft, delta)
    got_lift, got_cap = torch_frontier.frontier_constants(
        torch.tensor(target), torch.tensor(draft), delta
    )
    np.testing.assert_allclose(got_lift.numpy(), lift, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(got_cap.numpy(), cap, rtol=1e-10)
    assert fallback_rows == []
    # float32 rows: within float32 rounding of the float64 constants of the same rows
    rounded = [torch.tensor(rows).float() for rows in (target, draft)]
    lift32, cap32 = frontier_constants(*(rows.double().numpy() for rows in rounded), delta)
    got_lift, got_cap = torch_frontier.frontier_constants(*rounded, delta)
    np.testing.assert_allclose(got_lift.numpy(), lift32, rtol=1e-5, atol=1e-300)
    np.testing.assert_allclose(got_cap.numpy(), cap32, rtol=1e-5)


@pytest.mark.parametrize("per_position", [False, True], ids=["whole-block", "per-position"])
@pytest.mark.parametrize("spec", ["sps", "cactus:delta=0.5", "frontier:delta=0.2", "tas"])
def test_per_row_draft_counts_equal_each_row_verified_alone(spec, per_position, monkeypatch):
    """num_drafts[b] < k: row b is verified as if it had only its first num_drafts[b]
    drafts (numpy reference on the sliced row; the bonus law is the row after them)."""
    if per_position:
        monkeypatch.setattr(verify_step, "WHOLE_BLOCK_ELEMENTS", 0)
    rule = rules.parse(spec)
    target, draft, ids, accept_u, sample_u = random_block(seed=5, batch=400)
    counts = np.random.default_rng(6).integers(0, ids.shape[1] + 1, size=len(ids))
    tokens, accepted = sampler.verify(
        target,
        draft,
        torch.tensor(ids, device=DEVICE),
        rule,
        uniforms=(torch.tensor(accept_u), torch.tensor(sample_u)),
        num_drafts=torch.tensor(counts),
    )
    target64, draft64 = target.cpu().numpy(), draft.cpu().numpy()
    for row, count in enumerate(counts):
        if count == 0:  # no draft: a plain sample from the first row
            emitted = reference.inverse_cdf(target64[row, 0], sample_u[row])
            assert int(accepted[row]) == 0 and int(tokens[row, 0]) == int(emitted)
            continue
        expected, expected_accepted = reference.verify_block(
            rule,
            target64[row : row + 1, : count + 1],
            draft64[row : row + 1, :count],
            ids[row : row + 1, :count],
            accept_u[row : row + 1, :count],
            sample_u[row : row + 1],
        )
        assert int(accepted[row]) == int(expected_accepted[0]) <= count
        got = tokens[row].cpu().numpy()
        np.testing.assert_array_equal(got[: count + 1], expected[0])
        assert (got[count + 1 :] == sampler.PAD_ID).all()
