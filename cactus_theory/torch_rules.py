"""Every rule of ``cactus_theory.rules`` in torch, batched, for the sampler's verify step.

The numpy rules (float64, ``cactus_theory.rules``) are the oracle; each class here computes
the same quantities on tensors. q = target (verifier), p = draft, n = drafted token.

A verify step needs two things from a rule (``cactus_theory.sampler``):

- ``accept(...)``: a_i = P(accept the drafted n_i) for every drafted position, [B, k];
- ``residual(...)``: the law sampled at the first rejected position, one row per batch row.

Only the frontier and the decision rules read whole rows to decide acceptance: frontier
solves for one h per row, TAS needs the entropy of q, top-k its k-th largest value, greedy
its argmax. SpS, interp, cactus and cactus-exact decide from (q_n, p_n) alone, gathered at
the drafted ids, and build a full row only at the rejected position (never h over
[B, k, V]).

Precision: elementwise work over V runs in the compute dtype (float32, or float64 for
float64 inputs). Two scalar solves run in float64 because they are tiny or need it:
γ*(q_n, δ) for cactus-exact (B·k scalars; safeguarded Newton), and the frontier's sorted
prefix sums, bisection over its breakpoints and Newton root in c_hi (O(V) per row, summed
over up to 151,936 entries; a fixed number of passes, as ``rules.frontier``).
"""

from __future__ import annotations

import math

import torch

from cactus_theory import rules
from cactus_theory.rules import frontier as frontier_rule
from cactus_theory.rules.base import Rule

Tensor = torch.Tensor

# --- shared formulas -------------------------------------------------------------------------


def gsps_accept(adjusted_mass: Tensor, draft_mass: Tensor) -> Tensor:
    """a = min(1, h_n / p_n), and 0 where p_n = 0 (such a token is rejected, as in vLLM)."""
    safe = torch.where(draft_mass > 0, draft_mass, torch.ones_like(draft_mass))
    ratio = torch.where(draft_mass > 0, adjusted_mass / safe, torch.zeros_like(draft_mass))
    return torch.clamp(ratio, max=1.0)


def gsps_residual(adjusted: Tensor, draft_probs: Tensor) -> Tensor:
    """(h − p)_+ over the last axis, or h itself where that is all zero (then h = p).

    Unnormalised: the sampler's inverse CDF scales its uniform by the row total.
    """
    excess = torch.clamp_(adjusted - draft_probs, min=0.0)
    empty = (excess.sum(dim=-1, keepdim=True) <= 0).to(excess.dtype)
    return excess.addcmul_(empty, adjusted)  # + h on rows whose excess is all zero


def log_ratio(a: Tensor, b: Tensor, diff: Tensor | None = None) -> Tensor:
    """log(a/b) for a, b > 0: log1p(d/b) near a = b, log a − log b otherwise (as numpy)."""
    difference = a - b if diff is None else diff
    near = torch.log1p(difference / b)
    far = torch.log(a) - torch.log(b)
    return torch.where(difference.abs() < 0.5 * b, near, far)


def kl_div(x: Tensor, y: Tensor) -> Tensor:
    """x log(x/y) − x + y >= 0 elementwise (``divergences.kl_terms``): y at x = 0, +inf at
    x > 0 = y, and O(ε |x − y|) rounding near x = y."""
    positive = (x > 0) & (y > 0)
    safe_x = torch.where(positive, x, torch.ones_like(x))
    safe_y = torch.where(positive, y, torch.ones_like(y))
    inside = safe_x * log_ratio(safe_x, safe_y) - (safe_x - safe_y)
    at_zero = torch.where((x == 0) & (y >= 0), y, torch.full_like(x, math.inf))
    return torch.clamp(torch.where(positive, inside, at_zero), min=0.0)


def _binary_kl(x: Tensor, y: Tensor, diff: Tensor | None = None) -> Tensor:
    """x log(x/y) + (1−x) log((1−x)/(1−y)) from the exact difference (``divergences``)."""
    difference = x - y if diff is None else diff
    up_ok = (x > 0) & (y > 0)
    down_ok = (x < 1) & (y < 1)
    ones = torch.ones_like(difference)
    up = x * log_ratio(torch.where(up_ok, x, ones), torch.where(up_ok, y, ones), difference)
    rest_x = torch.where(down_ok, 1.0 - x, ones)
    rest_y = torch.where(down_ok, 1.0 - y, ones)
    down = rest_x * log_ratio(rest_x, rest_y, -difference)
    zero = torch.zeros_like(difference)
    value = torch.where(up_ok, up, zero) + torch.where(down_ok, down, zero)
    impossible = ((y <= 0) & (x > 0)) | ((y >= 1) & (x < 1))
    return torch.where(impossible, torch.full_like(value, math.inf), torch.clamp(value, min=0.0))


def _root_gap(a: Tensor, b: Tensor, diff: Tensor) -> Tensor:
    """√a − √b as (a − b)/(√a + √b)."""
    total = torch.sqrt(a) + torch.sqrt(b)
    return torch.where(total > 0, diff / torch.where(total > 0, total, 1.0), 0.0)


# --- γ*: binary divergences and their roots (float64) -----------------------------------------


def binary_divergence(name: str, x: Tensor, y: Tensor) -> Tensor:
    """D((x, 1−x) ‖ (y, 1−y)), the torch twin of ``divergences.binary`` (same formulas)."""
    if name == "kl":
        return _binary_kl(x, y)
    if name == "reverse-kl":
        return _binary_kl(y, x)
    if name == "tv":
        return torch.abs(x - y)
    if name == "chi2":
        spread = y * (1.0 - y)
        value = (x - y) ** 2 / torch.where(spread > 0, spread, torch.ones_like(spread))
        fallback = torch.where(x == y, torch.zeros_like(x), torch.full_like(x, math.inf))
        return torch.where(spread > 0, value, fallback)
    if name == "hellinger":
        diff = x - y
        return 0.5 * (_root_gap(x, y, diff) ** 2 + _root_gap(1.0 - x, 1.0 - y, -diff) ** 2)
    if name == "js":
        middle, half = 0.5 * (x + y), 0.5 * (x - y)
        return 0.5 * _binary_kl(x, middle, half) + 0.5 * _binary_kl(y, middle, -half)
    raise ValueError(f"divergence: unknown divergence {name!r}")


def binary_divergence_slope(name: str, x: Tensor, y: Tensor) -> Tensor:
    """d/dx of ``binary_divergence`` for the root-based divergences (kl, reverse-kl, js).

    KL: log(x/y) − log((1−x)/(1−y)); reverse KL: −y/x + (1−y)/(1−x);
    JS: ½ [log(x/m) − log((1−x)/(1−m))] with m = (x + y)/2.
    """
    if name == "kl":
        return torch.log(x / y) - torch.log((1.0 - x) / (1.0 - y))
    if name == "reverse-kl":
        return -y / x + (1.0 - y) / (1.0 - x)
    mid = 0.5 * (x + y)
    return 0.5 * (torch.log(x / mid) - torch.log((1.0 - x) / (1.0 - mid)))


def _closed_form_gamma(q_n: Tensor, delta: float, name: str) -> Tensor:
    """γ* for chi2, tv and hellinger (exact closed forms; see ``cactus_theory.gamma``)."""
    if delta == 0.0:
        return q_n.clone()
    if name == "chi2":
        raised = torch.clamp(q_n + torch.sqrt(delta * q_n * (1.0 - q_n)), max=1.0)
    elif name == "tv":
        raised = torch.clamp(q_n + delta, max=1.0)
    elif delta >= 1.0:
        return torch.ones_like(q_n)
    else:
        # acos(1 − δ) = 2 asin(√(δ/2)), accurate for small δ.
        angle = torch.arcsin(torch.sqrt(q_n)) + 2.0 * math.asin(math.sqrt(delta / 2))
        raised = torch.clamp(torch.sin(torch.clamp(angle, max=math.pi / 2)) ** 2, max=1.0)
        raised = torch.maximum(raised, q_n)
    return _feasible_side(raised, q_n, delta, name)


def _feasible_side(raised: Tensor, q_n: Tensor, delta: float, name: str) -> Tensor:
    """Step γ down by ulps while rounding puts it over budget (``gamma._feasible_side``)."""
    for _ in range(8):
        over = (binary_divergence(name, raised, q_n) > delta) & (raised > q_n)
        if not bool(torch.any(over).item()):
            break
        lowered = torch.maximum(torch.nextafter(raised, torch.full_like(raised, -math.inf)), q_n)
        raised = torch.where(over, lowered, raised)
    return raised


def _upper_bracket(q_n: Tensor, delta: float, name: str) -> Tensor:
    """1, or for reverse KL 1 − (1−q) exp(−(δ − q log q)/(1−q)) (where D >= δ)."""
    if name != "reverse-kl":
        return torch.ones_like(q_n)
    q_log_q = torch.special.xlogy(q_n, q_n)
    below_one = q_n < 1.0
    spread = torch.where(below_one, 1.0 - q_n, torch.ones_like(q_n))
    exponent = -(delta - q_log_q) / spread
    upper = -torch.expm1(exponent) + q_n * torch.exp(exponent)  # 1 − (1 − q) e^t
    return torch.where(below_one, upper, torch.ones_like(q_n))


def feasible_newton_root(
    name: str, q_n: Tensor, delta: float, low: Tensor, high: Tensor, max_iterations: int = 100
) -> Tensor:
    """The largest x in [low, high] with D(x, q_n) <= δ, for D increasing and convex in x.

    Requires D(low) < δ < D(high). Safeguarded Newton from the right end: for a convex
    increasing g = D − δ, Newton from a point with g > 0 stays right of the root and
    converges monotonically; a step that leaves the bracket (or an infinite slope) becomes
    a bisection. An element stops once its step is below 1e-13 relative (rounding noise in
    g then dominates). Finally each x is moved down by 1, 2, 4, ... ulps until g <= 0 as
    computed (``low`` is feasible), so the budget holds on the returned value, as in
    ``roots.feasible_root``.
    """
    lo, hi, x = low.clone(), high.clone(), high.clone()
    done = torch.zeros_like(x, dtype=torch.bool)
    from_newton = torch.zeros_like(x, dtype=torch.bool)
    for iteration in range(max_iterations):
        excess = binary_divergence(name, x, q_n) - delta
        # A Newton iterate of a convex g never crosses the root in exact arithmetic, so
        # one with g <= 0 sits within rounding noise of it: stop there (it is feasible).
        done = done | (excess == 0) | (from_newton & (excess < 0))
        hi = torch.where(excess > 0, x, hi)
        lo = torch.where(excess <= 0, x, lo)
        slope = binary_divergence_slope(name, x, q_n)
        newton = x - excess / slope
        inside = torch.isfinite(slope) & torch.isfinite(newton) & (newton >= lo) & (newton <= hi)
        step = torch.where(done, x, torch.where(inside, newton, 0.5 * (lo + hi)))
        done = done | (torch.abs(step - x) <= 1e-13 * x) | (hi - lo <= 1e-13 * hi)
        from_newton = inside
        x = step
        if iteration % 4 == 3 and bool(torch.all(done).item()):
            break
    result = x
    for power in range(64):
        over = (binary_divergence(name, result, q_n) - delta) > 0
        if not bool(torch.any(over).item()):
            break
        lowered = torch.maximum(x - x * (2.0**power * 2.0**-52), lo)
        result = torch.where(over, lowered, result)
    return torch.maximum(result, low)


def exact_raised_mass(
    q_n: Tensor, delta: float, divergence: str = "kl", cap: Tensor | None = None
) -> Tensor:
    """γ*(q_n, δ) elementwise in float64, optionally min(γ*, cap) (``gamma.exact_raised_mass``).

    Returns float64. Roots are solved only where the answer is not already known: a cap at
    or below q_n is the answer; an upper end within budget is the answer (γ* = 1 for KL when
    −log q_n <= δ); KL at q_n = 0 gives γ* = 0.
    """
    q_n = q_n.to(torch.float64)
    bound = None if cap is None else cap.to(torch.float64).expand_as(q_n)
    if divergence in ("chi2", "hellinger", "tv") or delta == 0.0:
        raised = _closed_form_gamma(q_n, delta, divergence)
        return raised if bound is None else torch.minimum(raised, bound)
    gamma = q_n.clone()
    upper = _upper_bracket(q_n, delta, divergence)
    capped = torch.zeros_like(q_n, dtype=torch.bool)
    if bound is not None:
        upper = torch.minimum(upper, bound)
        capped = bound <= q_n
        gamma = torch.where(capped, bound, gamma)
    at_upper = binary_divergence(divergence, upper, q_n)
    saturated = (q_n < 1.0) & (at_upper <= delta) & ~capped
    gamma = torch.where(saturated, upper, gamma)
    stuck = (q_n <= 0.0) & (divergence == "kl")
    solve = (q_n < 1.0) & ~saturated & ~stuck & ~capped
    if bool(torch.any(solve).item()):
        where = solve.nonzero(as_tuple=True)
        low, high = q_n[where], upper[where]
        gamma = gamma.index_put(where, feasible_newton_root(divergence, low, delta, low, high))
    return gamma


# --- the frontier: the fixed-pass solve of ``rules.frontier`` (float64) ------------------------


def _prefix(values: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """[R, V+1]: Σ of the first j values, j = 0..V (the cumsum written in place)."""
    rows, size = values.shape
    sums = torch.zeros(rows, size + 1, dtype=dtype or values.dtype, device=values.device)
    torch.cumsum(values, dim=-1, dtype=dtype, out=sums[:, 1:])
    return sums


def _suffix(values: Tensor) -> Tensor:
    """[R, V+1]: Σ of the values from index j on, summed from the end (tiny tails kept)."""
    return _prefix(values.flip(-1)).flip(-1)


def _at(table: Tensor, index: Tensor) -> Tensor:
    """table[r, index[r]] per row for index [R], or table[r, index[r, j]] for index [R, m]
    (any integer dtype)."""
    if index.dim() == 2:
        return table.gather(-1, index.long())
    return table.gather(-1, index.long()[:, None])[:, 0]


def _per_row(values: Tensor, position: Tensor) -> Tensor:
    """Per-row values [R] shaped to broadcast against positions [R] or [R, m]."""
    return values if position.dim() == 1 else values[:, None]


def _phi(t: Tensor) -> Tensor:
    """φ(t) = t log t − t + 1 >= 0 (φ(0) = 1), as s log s − (s − 1) with s = max(t, 1e-300)."""
    safe = torch.clamp(t, min=1e-300)
    return torch.clamp(safe * torch.log(safe) - (safe - 1.0), min=0.0)


def _tie_groups(ratio: Tensor) -> tuple[Tensor, Tensor] | None:
    """(start, end) per sorted position k: the first position with r_j = r_k and one past
    the last (``rules.frontier._tie_groups``); None when no two ratios are equal."""
    rows, size = ratio.shape
    same = ratio[:, 1:] == ratio[:, :-1]
    if not bool(same.any().item()):
        return None
    index = torch.arange(size, device=ratio.device).expand(rows, size)
    edge = torch.ones_like(same[:, :1])
    start = torch.cummax(torch.where(torch.cat([edge, ~same], dim=-1), index, 0), dim=-1)
    end_marks = torch.where(torch.cat([~same, edge], dim=-1), index, size).flip(-1)
    end = torch.cummin(end_marks, dim=-1).values.flip(-1) + 1
    return start.values, end


class _Path:
    """Sorted ratios r = p/q (+inf where q = 0) with prefix and suffix sums
    (``rules.frontier._Path``)."""

    def __init__(self, target_rows: Tensor, draft_rows: Tensor, kl_terms: Tensor) -> None:
        positive = target_rows > 0
        safe_target = torch.where(positive, target_rows, torch.ones_like(target_rows))
        ratio = torch.where(positive, draft_rows / safe_target, math.inf)
        self.ratio, order = torch.sort(ratio, dim=-1, stable=True)
        del ratio, positive, safe_target
        target_sorted = target_rows.gather(-1, order)
        draft_sorted = draft_rows.gather(-1, order)
        finite = torch.isfinite(self.ratio)
        self.target_below = _prefix(target_sorted)  # lifted side: small ratios
        self.draft_below = _prefix(draft_sorted)
        self.kl_below = _prefix(torch.where(finite, kl_terms.gather(-1, order), 0.0))
        self.target_above = _suffix(target_sorted)  # capped side: large ratios
        self.draft_above = _suffix(draft_sorted)
        del target_sorted, draft_sorted, order
        self.lifted = self.ratio < 1.0
        self.capped = finite & (self.ratio > 1.0)
        self.first_capped = (self.ratio <= 1.0).sum(dim=-1)
        self.first_infinite = finite.sum(dim=-1)
        last_finite = torch.clamp(self.first_infinite - 1, min=0)  # garbage rows: none
        self.upper = torch.clamp(_at(self.ratio, last_finite), min=1.0)
        self.end_mass = _at(self.draft_above, self.first_infinite)
        # D(r_k) = Σ_{r_i < r_k} (r_k q_i − p_i) (tied tokens left out), made nondecreasing
        # against rounding so that it can be searched.
        self.ties = _tie_groups(self.ratio)
        if self.ties is None:
            lift = self.ratio * self.target_below[:, :-1] - self.draft_below[:, :-1]
        else:
            start = self.ties[0]
            lift = self.ratio * self.target_below.gather(-1, start)
            lift -= self.draft_below.gather(-1, start)
        lift = torch.where(finite, lift, math.inf)
        self.lift_at_breaks = torch.cummax(lift, dim=-1).values


class _Segment:
    """Fixed sets L = {<low}, H = {>=high}: c_lo(c) = (P_H + P_L − c Q_H)/Q_L and
    KL(c) = Q_L φ(c_lo) + K_M + Q_H φ(c) (``rules.frontier._Segment``)."""

    def __init__(self, path: _Path, low: Tensor, high: Tensor) -> None:
        self.draft_high = _at(path.draft_above, high)
        self.target_high = _at(path.target_above, high)
        self.draft_low = _at(path.draft_below, low)
        self.target_low = _at(path.target_below, low)
        middle = _at(path.kl_below, high) - _at(path.kl_below, low)
        self.kl_middle = torch.clamp(middle, min=0.0)

    def lift_for(self, cap: Tensor) -> Tensor:
        return (self.draft_high - cap * self.target_high + self.draft_low) / self.target_low

    def kl_at(self, cap: Tensor, lift: Tensor) -> Tensor:
        return self.target_low * _phi(lift) + self.kl_middle + self.target_high * _phi(cap)

    def kl_and_slope(self, cap: Tensor) -> tuple[Tensor, Tensor]:
        """(KL(c), dKL/dc = Q_H log(c / c_lo))."""
        lift = self.lift_for(cap)
        slope = self.target_high * (torch.log(cap) - torch.log(lift))
        return self.kl_at(cap, lift), slope


def _cap_event_kl(path: _Path, position: Tensor) -> Tensor:
    """KL(h‖q) at c = r_k for each row's sorted position k, [R] or [R, m] (k capped).

    E(r_k) = Σ_{r_j > r_k} (p_j − r_k q_j) = P_>=j − r_k Q_>=j with j one past k's ties.
    The lift solves D(c_lo) = E: with l = #{i : D(r_i) <= E} (a search of the
    nondecreasing breakpoint values D(r_i)), L = {<l} and c_lo = (E + P_L)/Q_L, and
    KL = Q_L φ(c_lo) + Σ_{l<=i<j} q φ(r) + Q_>=j φ(r_k).
    """
    ratio = _at(path.ratio, position)
    after = position + 1 if path.ties is None else _at(path.ties[1], position)
    target_high = _at(path.target_above, after)
    moved = torch.clamp(_at(path.draft_above, after) - ratio * target_high, min=0.0)
    queries = moved.reshape(moved.shape[0], -1)
    below = torch.searchsorted(path.lift_at_breaks, queries, right=True).reshape(moved.shape)
    below = torch.clamp(below, min=1)
    target_low = _at(path.target_below, below)
    lift = torch.minimum((moved + _at(path.draft_below, below)) / target_low, ratio)
    middle = torch.clamp(_at(path.kl_below, after) - _at(path.kl_below, below), min=0.0)
    return target_low * _phi(lift) + middle + target_high * _phi(ratio)


def _bisect(first: Tensor, last: Tensor, rounds: int, predicate) -> Tensor:
    """The first position in [first, last) where a monotone ``predicate`` (false, then
    true) holds, per row (``last`` when none): ``rounds`` >= log2(V + 1) bisection steps,
    no host synchronisation."""
    low, high = first.clone(), last.clone()
    for _ in range(rounds):
        active = low < high
        middle = torch.minimum((low + high) // 2, torch.clamp(last - 1, min=0))
        holds = predicate(middle)
        high = torch.where(active & holds, middle, high)
        low = torch.where(active & ~holds, middle + 1, low)
    return low


#: Up to this many elements (rows × V) by device type, ``_first_position`` evaluates the
#: predicate at every position at once instead of bisecting: a few passes over [R, V]
#: cost less than 2 log2(V) rounds of small kernels there. CPU: measured crossover about
#: 3e4 elements on one thread (5 rows × 4096: 7.8 ms dense vs 12.1 ms bisecting; 20 ×
#: 4096: 30 vs 20 ms). CUDA: a guess from kernel-launch costs, not measured on a GPU.
DENSE_SEARCH_ELEMENTS = {"cuda": 1 << 22, "cpu": 1 << 15}


def _first_position(first: Tensor, last: Tensor, rounds: int, predicate, size: int) -> Tensor:
    """The first position in [first, last) where a monotone ``predicate`` (false, then
    true) holds, per row (``last`` when none): ``_bisect``, or for small problems (see
    ``DENSE_SEARCH_ELEMENTS``) one evaluation at every position [R, V]."""
    rows = first.shape[0]
    if rows * size > DENSE_SEARCH_ELEMENTS.get(first.device.type, 0):
        return _bisect(first, last, rounds, predicate)
    positions = torch.arange(size, device=first.device).expand(rows, size)
    inside = (positions >= first[:, None]) & (positions < last[:, None])
    hits = torch.where(inside & predicate(positions), positions, size)
    return torch.minimum(hits.amin(dim=-1), last)


def _locate_root(path: _Path, delta: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(low, high, left, right): the root's segment L = {<low}, H = {>=high} and its ends.

    Two bisections over the sorted ratios, O(log V) steps of O(1) work per row:

    1. KL at a cap breakpoint c = r_k (``_cap_event_kl``) rises with k, so ``high`` is
       the first capped position with KL > δ (first_infinite when none: the curve ends
       first), and c lies in [c_a, c_b] = [max(1, r_{high−1}), r_high].
    2. With H fixed, E(c) = P_H − c Q_H, so lift breakpoint i (c_lo = r_i) is passed at
       c_i = (P_H − D_i)/Q_H, where KL = Q_<i φ(r_i) + Σ_{i<=k<high} q φ(r) + Q_H φ(c_i).
       A lifted token i is still lifted at the root iff D_i < E(c_b), or
       D_i < E(c_a) and KL_i > δ; this holds for the first ``low`` of them.

    The nearest lift events on either side narrow [c_a, c_b] to the segment [left, right].
    The same segment as ``rules.frontier._locate_root`` (which sorts all breakpoints by
    the mass they move and bisects over them), without a second sort.
    """
    size = path.ratio.shape[-1]
    rounds = size.bit_length()
    high = _first_position(
        path.first_capped,
        path.first_infinite,
        rounds,
        lambda position: _cap_event_kl(path, position) > delta,
        size,
    )
    reaches = high < path.first_infinite
    low_cap = torch.where(
        high > path.first_capped, _at(path.ratio, torch.clamp(high - 1, min=0)), 1.0
    )
    low_cap = torch.clamp(low_cap, min=1.0)
    high_cap = torch.where(reaches, _at(path.ratio, torch.clamp(high, max=size - 1)), path.upper)
    draft_high, target_high = _at(path.draft_above, high), _at(path.target_above, high)
    safe_target = torch.where(target_high > 0, target_high, 1.0)
    kl_high = _at(path.kl_below, high)
    # Moved mass at both ends: E(c_b) = P_{q=0} once the curve has ended (Q_H = 0).
    mass_right = torch.clamp(draft_high - high_cap * target_high, min=0.0)
    mass_left = torch.where(reaches, draft_high - low_cap * target_high, mass_right)

    def still_lifted(position: Tensor) -> Tensor:
        def row(values: Tensor) -> Tensor:
            return _per_row(values, position)

        breaks = _at(path.lift_at_breaks, position)
        cap = (row(draft_high) - breaks) / row(safe_target)
        middle = torch.clamp(row(kl_high) - _at(path.kl_below, position), min=0.0)
        ratio = _at(path.ratio, position)
        kl = _at(path.target_below, position) * _phi(ratio) + middle + row(target_high) * _phi(cap)
        return (breaks < row(mass_right)) | ((breaks < row(mass_left)) & (kl > delta))

    first_middle = path.lifted.sum(dim=-1)
    low = _first_position(
        torch.zeros_like(first_middle), first_middle, rounds, lambda k: ~still_lifted(k), size
    )
    low = torch.clamp(low, min=1)
    # The lift events next to the root: l − 1 (still lifted, passed at a larger c) and l.
    right = torch.fmin(high_cap, (draft_high - _at(path.lift_at_breaks, low - 1)) / safe_target)
    following = torch.clamp(low, max=size - 1)
    at_next = (draft_high - _at(path.lift_at_breaks, following)) / safe_target
    left = torch.where(low < first_middle, torch.fmax(low_cap, at_next), low_cap)
    return low, high, left, torch.maximum(right, left)


#: Newton steps between host synchronisations (the convergence check).
NEWTON_BLOCK = 4


def _newton_cap(
    segment: _Segment, delta: float, low: Tensor, high: Tensor, done: Tensor
) -> tuple[Tensor, Tensor]:
    """Safeguarded Newton from c = ``high`` on each row's segment (rows already ``done``
    are left alone): ``rules.frontier._newton_cap``, checking convergence on the host once
    every ``NEWTON_BLOCK`` steps."""
    cap = high.clone()
    from_newton = torch.ones_like(done)
    tolerance = frontier_rule.NEWTON_TOLERANCE
    for iteration in range(frontier_rule.NEWTON_STEPS):
        kl, slope = segment.kl_and_slope(cap)
        excess = kl - delta
        over = excess > 0
        high = torch.where(over, cap, high)
        low = torch.where(over, low, cap)
        done = done | (~over & from_newton) | (excess == 0)
        step = excess / slope
        usable = torch.isfinite(slope) & (slope > 0)
        newton = cap - step
        small = usable & (step.abs() <= tolerance * cap)
        inside = usable & (newton >= low) & (newton <= high)
        middle = torch.where(
            high > 4.0 * low, torch.sqrt(low) * torch.sqrt(high), 0.5 * (low + high)
        )
        settled = done | small | (high - low <= tolerance * high)
        cap = torch.where(done, cap, torch.where(inside, newton, middle))
        done, from_newton = settled, inside
        if iteration % NEWTON_BLOCK == NEWTON_BLOCK - 1 and bool(done.all().item()):
            break
    return cap, low


def _feasible_cap(
    segment: _Segment, delta: float, cap: Tensor, low: Tensor, rows: Tensor
) -> Tensor:
    """Move c down by 1, 2, 4, ... ulps (not below ``low``) until KL(c) <= δ as computed,
    on the ``rows`` (a mask) that Newton solved."""
    for power in range(64):
        over = rows & (segment.kl_and_slope(cap)[0] > delta)
        if not bool(over.any().item()):
            break
        lowered = torch.maximum(cap - cap * 2.0 ** (power - 52), low)
        cap = torch.where(over, lowered, cap)
    return cap


def _solve_caps(
    target_rows: Tensor, draft_rows: Tensor, kl_terms: Tensor, delta: float
) -> tuple[Tensor, Tensor]:
    """(c_lo, c_hi) for rows with KL(p‖q) > δ > 0, in the fixed passes of
    ``rules.frontier._solve_caps``: sort the ratios, find the root's segment from KL at
    the breakpoints (``_locate_root``), Newton on it from the right, then ulps down until
    KL(h‖q) <= δ as computed. Rows whose curve ends first get c = max finite ratio; a
    budget below the rounding noise of KL at the segment's left end keeps that end.
    """
    path = _Path(target_rows, draft_rows, kl_terms)
    low, high, left, right = _locate_root(path, delta)
    segment = _Segment(path, low, high)
    reaches = high < path.first_infinite
    at_left, slope = segment.kl_and_slope(left)
    starts_over = at_left >= delta
    tangent = left - (at_left - delta) / slope
    start = torch.where(tangent > left, torch.fmin(tangent, right), right)
    solve = reaches & ~starts_over
    found, feasible_low = _newton_cap(segment, delta, left, start, ~solve)
    found = _feasible_cap(segment, delta, found, feasible_low, solve)
    cap = torch.where(solve, found, torch.where(reaches, left, path.upper))
    return torch.minimum(segment.lift_for(cap), cap), cap


#: Elements (rows × V) the frontier solve handles at once, by device type.
FRONTIER_CHUNK = {"cuda": 1 << 26, "cpu": 1 << 23}


def frontier_constants(
    target_rows: Tensor, draft_rows: Tensor, delta: float
) -> tuple[Tensor, Tensor]:
    """(c_lo, c_hi) per row of [R, V] (float64), the twin of ``rules.frontier_constants``.

    Rows with KL(p‖q) <= δ get (0, +inf) (h = p); δ = 0 gives (1, 1) (h = q). Rows are
    solved in chunks of ``FRONTIER_CHUNK`` elements to bound memory.
    """
    rows, vocab = target_rows.shape
    device = target_rows.device
    lift = torch.ones(rows, dtype=torch.float64, device=device)
    cap = torch.ones(rows, dtype=torch.float64, device=device)
    if delta <= 0 or rows == 0:
        return lift, cap
    step = max(1, FRONTIER_CHUNK.get(device.type, 1 << 23) // vocab)
    for start in range(0, rows, step):
        target = target_rows[start : start + step].to(torch.float64)
        draft = draft_rows[start : start + step].to(torch.float64)
        terms = kl_div(draft, target)
        fits = terms.sum(dim=-1) <= delta
        lift[start : start + step] = torch.where(fits, 0.0, 1.0)
        cap[start : start + step] = torch.where(fits, math.inf, 1.0)
        todo = (~fits).nonzero(as_tuple=True)[0]
        if todo.numel():
            lift[start + todo], cap[start + todo] = _solve_caps(
                target[todo], draft[todo], terms[todo], delta
            )
        del terms
    return lift, cap


def frontier_target(target_probs: Tensor, draft_probs: Tensor, lift: Tensor, cap: Tensor) -> Tensor:
    """h = clip(p, c_lo q, c_hi q) with c_hi q read as 0 where q = 0 (constants broadcast).

    Not renormalised, as in ``rules.frontier_target``: the lift makes Σ h = 1 to rounding.
    """
    lower = lift[..., None].to(target_probs.dtype) * target_probs
    capped = cap[..., None].to(target_probs.dtype) * target_probs
    upper = torch.where(target_probs > 0, capped, torch.zeros_like(target_probs))
    return torch.minimum(torch.maximum(draft_probs, lower), upper)


# --- the rules -------------------------------------------------------------------------------


class TorchRule:
    """A rule in torch. ``accept`` gets the whole block, ``residual`` the rejected rows.

    Shapes: target_probs and draft_probs [B, k, V] (compute dtype), draft_ids [B, k] (in
    range), target_at / draft_at [B, k] (q and p at the drafted ids). ``accept`` returns
    (a [B, k], state), where state holds per-position values the residual reuses (a tensor
    with leading [B, k] axes, a tuple of them, or None). ``residual`` gets one row per batch
    row, [R, V], the drafted ids [R] and the state taken at those positions.
    """

    reads_rows = False  # True when acceptance needs whole rows (not only q_n and p_n)

    def __init__(self, rule: Rule) -> None:
        self.rule = rule

    def accept(self, target_probs, draft_probs, draft_ids, target_at, draft_at):
        raise NotImplementedError

    def residual(self, target_row, draft_row, draft_id, state):
        raise NotImplementedError


class TorchSpS(TorchRule):
    """h = q: a = min(1, q_n/p_n); residual (q − p)_+."""

    def accept(self, target_probs, draft_probs, draft_ids, target_at, draft_at):
        return gsps_accept(target_at, draft_at), None

    def residual(self, target_row, draft_row, draft_id, state):
        return gsps_residual(target_row, draft_row)


class TorchInterp(TorchRule):
    """h = α p + (1 − α) q."""

    def _target(self, target, draft):
        return self.rule.alpha * draft + (1.0 - self.rule.alpha) * target

    def accept(self, target_probs, draft_probs, draft_ids, target_at, draft_at):
        return gsps_accept(self._target(target_at, draft_at), draft_at), None

    def residual(self, target_row, draft_row, draft_id, state):
        return gsps_residual(self._target(target_row, draft_row), draft_row)


def branch_scale(raised: Tensor, target_mass: Tensor) -> Tensor:
    """s_n = (1 − γ_n)/(1 − q_n); 1 when q_n = 1 (then h = q), as ``base.branch_scale``."""
    below_one = target_mass < 1.0
    spread = torch.where(below_one, 1.0 - target_mass, torch.ones_like(target_mass))
    return torch.where(below_one, (1.0 - raised) / spread, torch.ones_like(target_mass))


class TorchBranch(TorchRule):
    """Cactus and cactus-exact: h^n_n = γ_n, h^n_i = q_i (1 − γ_n)/(1 − q_n)."""

    def raised_mass(self, target_mass: Tensor, cap: Tensor | None = None) -> Tensor:
        if isinstance(self.rule, rules.Cactus):
            delta = self.rule.delta
            raised = torch.clamp(
                target_mass + torch.sqrt(2.0 * delta * target_mass * (1.0 - target_mass)), max=1.0
            )
            return raised if cap is None else torch.minimum(raised, cap)
        raised = exact_raised_mass(target_mass, self.rule.delta, self.rule.divergence, cap)
        return raised.to(target_mass.dtype)

    def accept(self, target_probs, draft_probs, draft_ids, target_at, draft_at):
        return gsps_accept(self.raised_mass(target_at, cap=draft_at), draft_at), None

    def residual(self, target_row, draft_row, draft_id, state):
        return gsps_residual(self.branch_targets(target_row, draft_id[:, None]), draft_row)

    def branch_targets(self, target_probs: Tensor, index: Tensor) -> Tensor:
        """h^n for the drafted ids ``index [..., 1]``: γ_n at n, s_n q elsewhere."""
        target_mass = target_probs.gather(-1, index)
        raised = self.raised_mass(target_mass)
        return (target_probs * branch_scale(raised, target_mass)).scatter(-1, index, raised)


class TorchFrontier(TorchRule):
    """h = clip(p, c_lo q, c_hi q), one h per row (reads whole rows to solve c_lo, c_hi)."""

    reads_rows = True

    def accept(self, target_probs, draft_probs, draft_ids, target_at, draft_at):
        if self.rule.delta == 0:
            return gsps_accept(target_at, draft_at), None
        batch, steps, vocab = target_probs.shape
        lift, cap = (
            value.reshape(batch, steps)
            for value in frontier_constants(
                target_probs.reshape(-1, vocab), draft_probs.reshape(-1, vocab), self.rule.delta
            )
        )
        adjusted_at = frontier_target(target_at[..., None], draft_at[..., None], lift, cap)
        return gsps_accept(adjusted_at[..., 0], draft_at), (lift, cap)

    def residual(self, target_row, draft_row, draft_id, state):
        if state is None:
            return gsps_residual(target_row, draft_row)
        lift, cap = state
        return gsps_residual(frontier_target(target_row, draft_row, lift, cap), draft_row)


def _one_hot_argmax(target_probs: Tensor) -> Tensor:
    """One-hot rows at argmax q (torch.argmax returns the first index on ties)."""
    index = torch.argmax(target_probs, dim=-1, keepdim=True)
    return torch.zeros_like(target_probs).scatter(-1, index, 1.0)


class TorchDecision(TorchRule):
    """tas, topk and greedy: a ∈ {0, 1} from (q, n); rejection emits a fixed recovery law."""

    reads_rows = True

    def accept_mask(self, target_probs: Tensor, draft_ids: Tensor, target_at: Tensor) -> Tensor:
        rule = self.rule
        if isinstance(rule, rules.TypicalAcceptance):
            entropy = -torch.special.xlogy(target_probs, target_probs).sum(dim=-1)
            threshold = torch.clamp(rule.alpha * torch.exp(-entropy), max=rule.epsilon)
            return target_at > threshold
        if isinstance(rule, rules.TopK):
            return target_at >= self._kth_largest(target_probs)
        return torch.argmax(target_probs, dim=-1) == draft_ids  # greedy

    def _kth_largest(self, target_probs: Tensor) -> Tensor:
        kth = min(self.rule.k, target_probs.shape[-1])
        return torch.topk(target_probs, kth, dim=-1).values[..., -1]

    def accept(self, target_probs, draft_probs, draft_ids, target_at, draft_at):
        mask = self.accept_mask(target_probs, draft_ids, target_at) & (draft_at > 0)
        return mask.to(target_at.dtype), None

    def residual(self, target_row, draft_row, draft_id, state):
        if isinstance(self.rule, rules.TopK):
            kept = target_row >= self._kth_largest(target_row)[:, None]
            return torch.where(kept, target_row, torch.zeros_like(target_row))
        return _one_hot_argmax(target_row)


_ADAPTERS: dict[type[Rule], type[TorchRule]] = {
    rules.SpS: TorchSpS,
    rules.Interp: TorchInterp,
    rules.Cactus: TorchBranch,
    rules.CactusExact: TorchBranch,
    rules.Frontier: TorchFrontier,
    rules.TypicalAcceptance: TorchDecision,
    rules.TopK: TorchDecision,
    rules.Greedy: TorchDecision,
}


def for_rule(rule: object) -> TorchRule:
    """The torch version of a rule made by ``rules.make`` / ``rules.parse``."""
    if not isinstance(rule, Rule):
        raise ValueError(
            f"rule: expected a rule from rules.make(...) or rules.parse(...), got "
            f"{type(rule).__name__}"
        )
    adapter = _ADAPTERS.get(type(rule))
    if adapter is None:
        raise ValueError(f"rule: no torch version of {rule!r}")
    return adapter(rule)
