"""A row's output law does not depend on the rest of the batch, and the divergence meter
measures what it says.

Setting: a vocabulary-8 pair with peaked, clearly different laws, the processors
T = 1, top-k 6, top-p 0.97. A row decodes 3 tokens with k = 2 drafts; it drafts
k_b = min(k, tokens left − 1), so its first two tokens are verified positions and its
last one a plain or bonus token, whatever the phase (which is why the exact law is
μ(x1) μ(x2 | x1) q(x3 | x1 x2) with μ = ``law.output_law`` of the rule for the processed
(q, p) after the prefix). The batch mixes ROWS copies of the prompt with OTHERS copies of
a longer prompt, so rows sit at different states in every step. Pearson chi-square at
ALPHA = 1e-3 with fixed seeds, on the 512 cells of (x1, x2, x3) (cells expected below 5
pooled); the negative control, the law with the last token at a verified position (what
a row gets when another row's budget sets its drafts), must be rejected.
"""

import numpy as np
import pytest
import torch
import torch_tiny_models as tiny
from scipy import stats

from cactus_theory import decode, divergences, law, rules
from cactus_theory.core.processors import SamplingSettings
from cactus_theory.sampler.processors import process_logits

ALPHA = 1e-3
VOCAB = 8
ROWS = 24_000
OTHERS = 6_000
SETTINGS = SamplingSettings(temperature=1.0, top_k=6, top_p=0.97)
PROMPT = [5, 1, 6, 2]
OTHER_PROMPT = [3, 7, 7, 1, 4, 4, 2]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pair():
    verifier = tiny.llama(seed=10, vocab=VOCAB, hidden=16, init=0.3)
    draft = tiny.llama(seed=11, vocab=VOCAB, hidden=16, layers=1, init=0.3)
    return verifier, draft


def laws(model, prefixes: list[list[int]]) -> np.ndarray:
    """Processed next-token laws [len(prefixes), V] after each prefix (float64)."""
    ids = torch.tensor(prefixes, device=tiny.DEVICE)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, -1]
    return process_logits(logits, SETTINGS).double().cpu().numpy()


class Exact:
    """q and p after every prefix of up to two new tokens, and the exact laws from them."""

    def __init__(self, verifier, draft):
        ones = [PROMPT + [a] for a in range(VOCAB)]
        twos = [PROMPT + [a, b] for a in range(VOCAB) for b in range(VOCAB)]
        self.q0, self.p0 = laws(verifier, [PROMPT])[0], laws(draft, [PROMPT])[0]
        self.q1, self.p1 = laws(verifier, ones), laws(draft, ones)  # [V, V]: after x1
        self.q2 = laws(verifier, twos).reshape(VOCAB, VOCAB, VOCAB)  # [x1, x2, V]
        self.p2 = laws(draft, twos).reshape(VOCAB, VOCAB, VOCAB)

    def joint(self, rule, last_verified: bool = False) -> np.ndarray:
        """P(x1, x2, x3) [V^3]; ``last_verified`` puts x3 at a verified position."""
        first = law.output_law(rule, self.q0, self.p0)  # [V]
        second = law.output_law(rule, self.q1, self.p1)  # [V(x1), V(x2)]
        third = self.q2
        if last_verified:
            third = law.output_law(rule, self.q2, self.p2)
        return (first[:, None, None] * second[:, :, None] * third).reshape(-1)

    def expected_meter(self, rule) -> float:
        """E[Σ_t KL(μ_t ‖ q_t)] over a row: KL at x1, plus the mean KL at x2 (x3 adds 0)."""
        first = law.output_law(rule, self.q0, self.p0)
        second = law.output_law(rule, self.q1, self.p1)
        kl_second = divergences.kl(second, self.q1)  # [V] per x1
        return float(divergences.kl(first, self.q0) + first @ kl_second)


def decode_mixed(pair, rule, seed):
    """ROWS copies of PROMPT and OTHERS of OTHER_PROMPT, interleaved, left-padded."""
    verifier, draft = pair
    width = len(OTHER_PROMPT)
    padded = [0] * (width - len(PROMPT)) + PROMPT
    order = np.random.default_rng(seed).permutation(ROWS + OTHERS)
    is_main = order < ROWS
    ids = torch.tensor([padded if main else OTHER_PROMPT for main in is_main])
    mask = torch.ones_like(ids)
    mask[torch.tensor(is_main), : width - len(PROMPT)] = 0
    result = decode.speculative_generate(
        verifier,
        draft,
        ids.to(tiny.DEVICE),
        rule=rule,
        k=2,
        max_new_tokens=3,
        temperature=SETTINGS.temperature,
        top_k=SETTINGS.top_k,
        top_p=SETTINGS.top_p,
        eos_token_id=[],
        attention_mask=mask.to(tiny.DEVICE),
        generator=torch.Generator().manual_seed(seed),
    )
    return result, torch.tensor(is_main)


def cells_of(result, rows) -> np.ndarray:
    new = result.sequences[rows, -3:].numpy()
    return (new[:, 0] * VOCAB + new[:, 1]) * VOCAB + new[:, 2]


def p_value(cells: np.ndarray, probabilities: np.ndarray) -> float:
    counts = np.bincount(cells, minlength=probabilities.size).astype(float)
    if np.any(counts[probabilities == 0] > 0):
        return 0.0
    expected = probabilities * len(cells)
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    keep = wanted > 0
    return stats.chisquare(
        observed[keep], wanted[keep] * observed.sum() / wanted[keep].sum()
    ).pvalue


@pytest.fixture(scope="module")
def exact(pair):
    return Exact(*pair)


class Doubled(rules.BranchRule):
    """A user's rule written with numpy alone, no declarations: γ_n = min(1, 2 q_n)."""

    name = "test-doubled"

    def raised_mass(self, target_mass, cap=None):
        raised = np.minimum(1.0, 2.0 * target_mass)
        return raised if cap is None else np.minimum(raised, cap)


SPECS = [
    "sps",
    "cactus:delta=0.3",
    "cactus-exact:delta=0.3",
    "frontier:delta=0.3",
    "sglang:threshold_single=0.2,threshold_acc=0.3",
    "relaxed:top_k=3,delta=0.3",
    Doubled(),
]


def as_rule(spec):
    return spec if isinstance(spec, rules.Rule) else rules.parse(spec)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_a_rows_law_in_a_mixed_batch_is_its_law_alone(pair, exact, spec):
    rule = as_rule(spec)
    result, is_main = decode_mixed(pair, rule, seed=31)
    cells = cells_of(result, is_main)
    assert p_value(cells, exact.joint(rule)) > ALPHA
    if spec != "sps":
        # Negative controls: the last token at a verified position, and the lossless law.
        assert p_value(cells, exact.joint(rule, last_verified=True)) < ALPHA
        assert p_value(cells, exact.joint(rules.parse("sps"))) < ALPHA
    # The drafts per step depend on the row alone: 2, then what is left minus one.
    drafts = result.draft_counts[:, is_main]
    assert set(drafts[drafts >= 0].tolist()) <= {0, 1, 2}


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_the_meter_mean_is_the_exact_expected_sequence_kl(pair, exact, spec):
    """Σ_t KL(μ_t ‖ q_t) per row, averaged over rows, against its exact expectation
    (enumerated), within 4 standard errors; here no position's law depends on the
    phase, so it is also the exact KL of the text."""
    rule = as_rule(spec)
    result, is_main = decode_mixed(pair, rule, seed=32)
    per_row = result.sequence_kl[is_main].numpy()
    expected = exact.expected_meter(rule)
    text_kl = divergences.kl(exact.joint(rule), exact.joint(rules.parse("sps")))
    assert expected == pytest.approx(text_kl, rel=1e-9, abs=1e-12)
    if spec == "sps":
        assert np.all(per_row == 0.0)
        return
    error = per_row.std() / np.sqrt(len(per_row))
    assert abs(per_row.mean() - expected) < 4 * error + 1e-12
    # Negative control: a meter that ignored the second token would be caught.
    first_only = float(divergences.kl(law.output_law(rule, exact.q0, exact.p0), exact.q0))
    assert abs(first_only - expected) > 8 * error
    # Every generated token carries its KL; the last (plain or bonus) token carries 0.
    assert result.token_kl.shape == (ROWS + OTHERS, 3)
    assert torch.all(result.token_kl[is_main, 2] == 0)


def test_the_meter_upper_bounds_the_text_kl_when_the_phase_matters(pair):
    """k = 1, three tokens: x2 is a bonus token (law q) after an accepted x1, a verified
    position after a rejected one, so x2's law depends on the phase. The meter's
    expectation is the KL of (text, phase), enumerated exactly; it exceeds the text's
    own KL (data processing; here by 4e-4 nats, too little to tell apart by sampling),
    and the meter's mean matches it within 4 standard errors."""
    verifier, draft = pair
    rule = rules.parse("cactus:delta=0.5")
    exact = Exact(verifier, draft)
    first = law.output_law(rule, exact.q0, exact.p0)
    accept = rule.accept_probs(exact.q0, exact.p0)
    accepted_given_x1 = np.divide(
        exact.p0 * accept, first, out=np.zeros_like(first), where=first > 0
    )  # P(the draft was accepted | x1)
    second = law.output_law(rule, exact.q1, exact.p1)  # [x1, x2] at a verified position
    mixed = accepted_given_x1[:, None] * exact.q1 + (1 - accepted_given_x1[:, None]) * second
    joint_kl = divergences.kl(first, exact.q0) + np.sum(
        first * (1 - accepted_given_x1) * divergences.kl(second, exact.q1)
    )
    text_kl = divergences.kl(first, exact.q0) + np.sum(first * divergences.kl(mixed, exact.q1))
    assert text_kl < joint_kl
    ids = torch.tensor([PROMPT] * ROWS, device=tiny.DEVICE)
    result = decode.speculative_generate(
        verifier,
        draft,
        ids,
        rule=rule,
        k=1,
        max_new_tokens=3,
        temperature=SETTINGS.temperature,
        top_k=SETTINGS.top_k,
        top_p=SETTINGS.top_p,
        eos_token_id=[],
        generator=torch.Generator().manual_seed(33),
    )
    per_row = result.sequence_kl.numpy()
    error = per_row.std() / np.sqrt(len(per_row))
    assert abs(per_row.mean() - joint_kl) < 4 * error
    # The text itself follows the mixed law (chi-square on (x1, x2)).
    new = result.sequences[:, len(PROMPT) :].numpy()
    cells = new[:, 0] * VOCAB + new[:, 1]
    assert p_value(cells, (first[:, None] * mixed).reshape(-1)) > ALPHA
