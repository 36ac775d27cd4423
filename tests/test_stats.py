"""The comparison's statistics and verdict rule (no training; a few seconds).

What is checked (Student's t and Holm's correction themselves are tested in
``tests/test_student_t.py``): the paired t-test, its interval and the one-sample bound against
``scipy.stats`` (a test-only dependency); the verdict rule on made-up runs (a small consistent
difference is not called, a large one is, a huge family makes a moderate one "within noise",
noise in the evaluation text withdraws a call); the sign rule's false-positive rate, which the
notebook teaches; the bootstrap of the text's noise by document, accuracy intervals inside
[0, 1], a probe no arm clears leaving the family, and the sweep's mean over its seeds.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from course_lib.compare.claims import (
    Bound,
    Change,
    Difference,
    _bootstrap_se,
    judge,
    plateau_arms,
    report_claims,
    uninformative_probes,
    untested_questions,
)
from course_lib.compare.results import mean_sweep_loss
from course_lib.compare.stats import (
    Paired,
    Spread,
    bound_test,
    paired,
    spread,
)

scipy_stats = pytest.importorskip("scipy.stats")


# -- tests on seeds ----------------------------------------------------------------------------


def test_paired_t_test_interval_and_p_match_scipy():
    a = [2.01, 2.05, 1.98, 2.10, 2.03]
    b = [2.10, 2.09, 2.08, 2.18, 2.06]
    diff = Paired({s: x - y for s, (x, y) in enumerate(zip(a, b, strict=True))})
    expected = scipy_stats.ttest_rel(a, b)
    assert diff.t == pytest.approx(expected.statistic, rel=1e-10)
    assert diff.p_value == pytest.approx(expected.pvalue, rel=1e-9)
    lo, hi = diff.ci()
    d = [x - y for x, y in zip(a, b, strict=True)]
    want = scipy_stats.t.interval(0.95, len(d) - 1, loc=sum(d) / len(d), scale=scipy_stats.sem(d))
    assert (lo, hi) == pytest.approx(want, rel=1e-9)
    spread = Spread({0: 1.0, 1: 2.0, 2: 3.0})
    assert (spread.mean, spread.sd, spread.low, spread.high) == (2.0, 1.0, 1.0, 3.0)
    assert spread.text(2) == "2.00 ± 1.00"
    assert spread.interval_text(1) == "2.0 [-0.5, 4.5]"


def test_one_sided_bound_matches_scipy():
    values = {0: 0.71, 1: 0.66, 2: 0.80, 3: 0.69, 4: 0.75}
    above = bound_test(values, 0.6, "above")
    expected = scipy_stats.ttest_1samp(list(values.values()), 0.6, alternative="greater")
    assert above.p_value == pytest.approx(expected.pvalue, rel=1e-9)
    below = bound_test(values, 0.6, "below")
    assert below.p_value == pytest.approx(1 - expected.pvalue, rel=1e-9)
    with pytest.raises(ValueError, match="side"):
        bound_test(values, 0.6, "beside")


def test_no_spread_and_one_seed():
    assert Paired({0: -0.5, 1: -0.5}).p_value == 0.0  # every seed the same, not zero
    assert Paired({0: 0.0, 1: 0.0}).p_value == 1.0
    assert Paired({0: -1.0}).p_value == 1.0  # one seed never makes a verdict
    assert bound_test({0: 1.0, 1: 1.0}, 0.5, "above").p_value == 0.0


# -- the verdict rule -------------------------------------------------------------------------


def _run(arm, seed, loss, *, objective="clm", units=None):
    """A made-up results dict with a test loss (and, optionally, per-window sums)."""
    units = units or ([loss * 10.0] * 4, [10] * 4)
    return {
        "objective": objective,
        "arm": arm,
        "encoding": arm,
        "seed": seed,
        "data": {"unigram_entropy_nats": 3.2},
        "evaluation": {
            "val": {"status": "ok", "loss": loss, "unit_sums": units[0], "unit_counts": units[1]}
        },
        "probes": {},
        "learned_values": {},
    }


def test_a_small_difference_is_not_called_and_a_large_one_is():
    small = [_run("a", s, 2.0 + 0.01 * s) for s in range(6)]
    small += [_run("b", s, 2.01 + 0.01 * s + 0.001 * (s % 2)) for s in range(6)]
    claim = Difference("clm", "a", "b", "val_loss")
    verdict = judge(small, [claim])[claim]
    assert verdict.p_value < 1e-4  # the seeds agree ...
    assert verdict.verdict == "within noise"  # ... but 0.01 nats is below the minimum effect
    assert verdict.text().endswith("(within noise: smaller than the minimum effect of 0.02)")
    large = [_run("a", s, 2.0 + 0.01 * s) for s in range(6)]
    large += [_run("b", s, 2.1 + 0.01 * s + 0.002 * (s % 2)) for s in range(6)]
    verdict = judge(large, [claim])[claim]
    assert verdict.verdict == "lower" and verdict.estimate == pytest.approx(-0.1, abs=2e-3)


def test_holm_makes_a_moderate_difference_within_noise_in_a_large_family():
    rng = random.Random(0)
    results = [_run("a", s, 2.0 + rng.gauss(0, 0.01)) for s in range(5)]
    results += [_run("b", s, r["evaluation"]["val"]["loss"] + 0.05 + rng.gauss(0, 0.02))
                for s, r in enumerate(results)]  # fmt: skip
    claim = Difference("clm", "b", "a", "val_loss")
    alone = judge(results, [claim])[claim]
    assert alone.verdict == "higher"
    # the same claim among many that show nothing: Holm multiplies its p by their number
    others = [Bound("clm", "a", "val_loss", "below", 1.0) for _ in range(200)]
    crowded = judge(results, [claim, *others])[claim]
    assert crowded.p_value == alone.p_value and crowded.p_holm == pytest.approx(
        min(1.0, 201 * alone.p_value)
    )
    assert crowded.verdict == "within noise"
    # Holm's p, printed on the line, says why: no reason is added
    assert crowded.reason() is None and crowded.text().endswith("(within noise)")


def test_noise_in_the_evaluation_text_withdraws_a_call():
    # b - a = 0.05 in every seed, but carried by one window of four: the text's own standard
    # error of the difference is then large, and the call is withdrawn
    def runs(spread_over_windows: bool):
        out = []
        for s in range(5):
            base = 2.0 + 0.01 * s
            out.append(_run("a", s, base, units=([base * 10] * 4, [10] * 4)))
            extra = [0.5] * 4 if spread_over_windows else [2.0, 0, 0, 0]
            sums = [base * 10 + e + 0.01 * s * (i == 0) for i, e in enumerate(extra)]
            out.append(_run("b", s, sum(sums) / 40, units=(sums, [10] * 4)))
        return out

    claim = Difference("clm", "b", "a", "val_loss")
    assert judge(runs(True), [claim])[claim].verdict == "higher"
    noisy = judge(runs(False), [claim])[claim]
    assert noisy.eval_se > noisy.estimate / 4 and noisy.verdict == "within noise"
    ratio = f"{noisy.eval_se / noisy.estimate:.2f}"
    why = f"the test text's standard error is {ratio} of the estimate, a call needs under 0.25"
    assert noisy.reason() == why
    assert noisy.text().endswith(f"(within noise: {noisy.reason()})")


def test_bounds_and_changes():
    results = [_run("a", s, 0.3 + 0.01 * (s % 3)) for s in range(6)]
    above = Bound("clm", "a", "val_loss", "above", 0.2)
    below = Bound("clm", "a", "val_loss", "below", 0.2)
    change = Change("clm", "a", "val_loss")  # any metric: tested against 0
    verdicts = judge(results, [above, below, change])
    assert verdicts[above].verdict == "above" and verdicts[below].verdict == "not shown"
    assert verdicts[change].verdict == "higher"


def test_plateau_arms_are_those_with_a_seed_near_the_unigram_entropy():
    results = [_run("ok", s, 2.9, objective="mlm") for s in range(3)]
    results += [_run("stuck", s, 3.0 + 0.1 * s, objective="mlm") for s in range(3)]
    assert plateau_arms(results) == {"stuck": pytest.approx(3.2)}


def test_paired_reads_the_same_seeds_of_both_arms():
    results = [_run("a", 0, 1.0), _run("a", 1, 2.0), _run("b", 0, 1.5), _run("b", 1, 2.1)]
    diff = paired(results, "clm", "a", "b", "val_loss")
    assert diff.differences == pytest.approx({0: -0.5, 1: -0.1})
    assert paired(results, "clm", "a", "missing", "val_loss") is None


def test_the_sign_rule_calls_a_null_difference_two_in_two_to_the_n():
    """What notebook 10 shows by simulation: with no true difference, every seed agreeing in
    sign happens with probability 2 x 0.5^n; the t-test at 0.05 is wrong 5% of the time."""
    rng = random.Random(7)
    trials = 4000
    for n in (3, 5):
        signs = tests = 0
        for _ in range(trials):
            d = [rng.gauss(0.0, 1.0) for _ in range(n)]
            signs += all(x > 0 for x in d) or all(x < 0 for x in d)
            tests += Paired(dict(enumerate(d))).p_value < 0.05
        assert signs / trials == pytest.approx(2 * 0.5**n, abs=0.02)
        assert tests / trials == pytest.approx(0.05, abs=0.012)


# -- the text's noise by document, bounded intervals, probes that measure nothing ---------------


def test_the_bootstrap_resamples_whole_documents():
    # eight windows in two documents; each document's windows move together
    values = torch.tensor([1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0], dtype=torch.float64)
    counts = torch.ones(8, dtype=torch.float64)
    by_window = _bootstrap_se(values, counts)
    by_document = _bootstrap_se(values, counts, blocks=[0, 0, 0, 0, 7, 7, 7, 7])
    # two independent documents of mean 1 and 3: a mean's standard error near 1 / sqrt(2)
    assert by_document == pytest.approx(1 / math.sqrt(2), rel=0.1)
    assert by_window == pytest.approx(1 / math.sqrt(8), rel=0.15)
    # one block per unit is the plain bootstrap, draw for draw
    assert _bootstrap_se(values, counts, blocks=list(range(8))) == by_window


def test_an_accuracy_interval_stays_inside_zero_and_one():
    runs = [{"seed": s, "probes": {"word_order": {"accuracy": a}}}
            for s, a in enumerate([1.0, 1.0, 0.6, 1.0, 1.0])]  # fmt: skip
    plain = Spread({r["seed"]: r["probes"]["word_order"]["accuracy"] for r in runs})
    assert plain.ci()[1] > 1.0  # the t interval of five accuracies reaches past 1
    bounded = spread(runs, "word_order")
    assert bounded.ci() == (plain.ci()[0], 1.0) and bounded.mean == plain.mean
    assert bound_test({0: 0.0, 1: 0.2, 2: 0.0}, 0.5, "below", (0.0, 1.0)).ci()[0] == 0.0


def _probe_run(arm, seed, accuracy, floor=0.25):
    run = _run(arm, seed, 2.0 + 0.1 * (arm == "b"))
    run["probes"] = {
        "retrieval": {
            "accuracy": accuracy,
            "bag_of_symbols_baseline": floor,
            "unit_correct": [accuracy * 4],
            "unit_count": [4],
        }
    }
    return run


def test_a_probe_no_arm_clears_leaves_the_family_with_its_reason():
    low = [_probe_run(arm, s, 0.15 + 0.01 * s) for arm in ("none", "rope") for s in range(5)]
    idle = uninformative_probes(low)
    assert list(idle) == [("clm", "retrieval")] and "0.250" in idle["clm", "retrieval"]
    family = report_claims(low)
    assert family and not any(c.metric == "retrieval" for c in family)
    untested = dict(untested_questions(low))
    assert any(c.metric == "retrieval" for c in untested)
    # one arm above the floor: the probe measures something, and its claims are tested
    high = low[:5] + [_probe_run("rope", s, 0.5) for s in range(5)]
    assert uninformative_probes(high) == {}
    assert any(c.metric == "retrieval" for c in report_claims(high))


def test_the_sweep_chooses_by_the_mean_over_its_seeds_and_a_diverged_run_never_wins():
    assert mean_sweep_loss({1000: 2.0, 1001: 2.2}, (1000, 1001)) == pytest.approx(2.1)
    assert mean_sweep_loss({1000: 1.0, 1001: math.nan}, (1000, 1001)) == math.inf
