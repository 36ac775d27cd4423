"""The comparison's claims: one family, declared in advance, tested together (Holm).

Everything the report says about a difference is one of three kinds of claim, each tested on
the per-seed values of :mod:`course_lib.compare.stats`:

* :class:`Difference` ``(objective, a, b, metric)``: arm ``a`` minus arm ``b``, seed by seed
  (paired t-test, two-sided); verdict ``"lower"`` or ``"higher"`` (``a`` than ``b``);
* :class:`Change` ``(objective, arm, metric)``: a metric that is itself a difference within each
  run (a position shift's cost, a long context's effect), against zero (one-sample t-test,
  two-sided); verdict ``"lower"`` (below zero) or ``"higher"``;
* :class:`Bound` ``(objective, arm, metric, side, value)``: the arm's mean is above (or below)
  ``value`` (one-sample t-test, one-sided); verdict ``"above"`` or ``"below"``.

**The verdict rule.** The p-values of *every* claim of the family go through Holm's correction
together (:func:`course_lib.compare.stats.holm`, family-wise error ``ALPHA`` = 0.05). A claim is
called (its direction, or its side) only when

1. its Holm-adjusted p-value is below ``ALPHA``,
2. the estimate is at least the metric kind's minimum effect
   (:data:`course_lib.compare.stats.MIN_EFFECT`: 0.02 nats for a loss, 0.05 for an accuracy;
   a :class:`Bound` carries its own margin in ``value``), and
3. the evaluation text's own noise is small next to it: the bootstrap standard error of the
   estimate over evaluation units (text windows, word-order pairs, retrieval examples; the
   same resamples for every seed and both arms) is below a quarter of the estimate's distance
   from zero (or from ``value``).

Otherwise the verdict is ``"within noise"`` (``"not shown"`` for a bound). Neither means "equal":
only that these runs do not show a difference.

**The family** (:func:`report_claims`): each ablation against its own encoding on the metrics it
is asked about (:attr:`course_lib.compare.arms.Arm.metrics`), and the claims of
:func:`questions`, which notebook 10 discusses; both were written before the committed run was
made. Claims on a masked-LM arm that did not leave the unigram plateau
(:func:`plateau_arms`) are not tested: a ranking of models that have not started learning says
nothing. A new encoding or ablation adds its claims to the family (and makes every threshold a
little stricter) once it has runs: that is the price of asking more questions. Until then its
claims are no question of the results (:func:`declared_claims`): an arm not run yet
(:meth:`course_lib.compare.presets.Preset.not_run_yet`) changes neither the family nor the
list of declared questions left untested.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from course_lib.compare.arms import ABLATIONS, arms_run
from course_lib.compare.stats import (
    ALPHA,
    METRICS,
    MIN_EFFECT,
    Paired,
    bound_test,
    by_arm,
    holm,
    metric,
    metric_blocks,
    metric_units,
    paired,
)
from course_lib.model import OBJECTIVES
from course_lib.registry import get_encoding, sequence_encodings

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "PLATEAU_MARGIN",
    "AGAINST_ROPE",
    "Bound",
    "Change",
    "Difference",
    "Verdict",
    "declared_claims",
    "evaluation_se",
    "judge",
    "plateau_arms",
    "questions",
    "report_claims",
    "untested_questions",
    "spread_of_called",
    "uninformative_probes",
]

#: An MLM arm left the unigram plateau when every seed's test loss is this far below it (nats).
PLATEAU_MARGIN = 0.1

#: Resamples of the evaluation units in the bootstrap of the evaluation text's own noise.
BOOTSTRAP_RESAMPLES = 1000


@dataclass(frozen=True)
class Difference:
    """Arm ``a`` minus arm ``b`` on ``metric``, seed by seed."""

    objective: str
    a: str
    b: str
    metric: str

    def describe(self) -> str:
        return f"{self.objective}: {self.a} - {self.b}, {METRICS[self.metric].label}"


@dataclass(frozen=True)
class Change:
    """A within-run difference (``metric``, e.g. ``shift_cost@7L``) of ``arm`` against 0."""

    objective: str
    arm: str
    metric: str

    def describe(self) -> str:
        return f"{self.objective}: {self.arm}, {METRICS[self.metric].label}"


@dataclass(frozen=True)
class Bound:
    """``arm``'s mean of ``metric`` is on ``side`` (``"above"``/``"below"``) of ``value``."""

    objective: str
    arm: str
    metric: str
    side: str
    value: float

    def describe(self) -> str:
        return (
            f"{self.objective}: {self.arm}, {METRICS[self.metric].label} {self.side} {self.value:g}"
        )


Claim = Difference | Change | Bound


@dataclass(frozen=True)
class Verdict:
    """A claim's test: the ``estimate`` (mean over seeds of the difference, the change or the
    value), its 95% t interval over seeds, the uncorrected and Holm-adjusted p-values, the
    bootstrap standard error from the evaluation text (None when the metric has no units), the
    number of seeds, the ``verdict``, and ``failed``: the rules other than Holm's p that the
    claim fails (the minimum effect or the bound's side, the evaluation text's noise), in words."""

    claim: Claim
    estimate: float
    ci: tuple[float, float]
    p_value: float
    p_holm: float
    eval_se: float | None
    seeds: int
    verdict: str
    failed: tuple[str, ...] = ()

    @property
    def called(self) -> bool:
        return self.verdict not in ("within noise", "not shown")

    def reason(self) -> str | None:
        """Why a claim whose Holm-adjusted p-value passes is still not called: the other rules
        of the module docstring it fails (:attr:`failed`, from :func:`judge`), or None (called,
        or Holm's p, printed beside it, already fails)."""
        if self.called or self.p_holm >= ALPHA or not self.failed:
            return None
        return "; ".join(self.failed)

    def text(self) -> str:
        """``estimate [95% interval], p = ..., Holm p = ... (verdict)``, the verdict followed by
        :meth:`reason` when Holm's p passes but another rule does not."""
        digits = METRICS[self.claim.metric].digits
        lo, hi = self.ci
        sign = "+" if not isinstance(self.claim, Bound) else ""
        why = self.reason()
        verdict = self.verdict if why is None else f"{self.verdict}: {why}"
        return (
            f"{self.estimate:{sign}.{digits}f} [{lo:{sign}.{digits}f}, {hi:{sign}.{digits}f}], "
            f"p {_p_text(self.p_value)}, Holm p {_p_text(self.p_holm)} ({verdict})"
        )


def _p_text(p: float) -> str:
    """A p-value to two significant digits, ``< 0.0001`` below that."""
    if p < 1e-4:
        return "< 0.0001"
    return f"= {p:.2g}"


# ---------------------------------------------------------------------------------------------
# The declared questions (notebook 10): written before the committed run was made
# ---------------------------------------------------------------------------------------------

#: The encodings compared with RoPE, today's default, at the training length (both objectives;
#: CoPE and FoX causal only).
AGAINST_ROPE = ("rse", "stick_breaking", "exposb", "alibi", "cope", "fox")


def questions() -> tuple[Claim, ...]:
    """The claims notebook 10 makes besides the ablations, declared before the committed run.
    Most are rules over the registry, so an encoding registered later brings its own (asked of
    results that hold its runs, :func:`declared_claims`): for each objective and each sequence
    encoding ``e`` it can train (``none`` aside), ``e`` against ``none`` at the training length;
    what a long context does to ``e``'s far targets; ``e``'s word-order accuracy above 0.6 (the
    masked ``none`` is exactly 1/2 by a theorem, the causal one is asked too); on causal runs,
    retrieval above 0.3 (the bag-of-symbols floor is about 0.23). Then the named questions:
    :data:`AGAINST_ROPE` against RoPE and RSE against the plain stick; the position shift's cost
    for the encodings that are not relative (``absolute``, ``exposb``); RoPE and ExpoSB past
    their training length (a long context fine at 2x, costly by 4x: notebook 07); retrieval
    solved (above 0.95) by RoPE, ExpoSB and RSE."""
    claims: list[Claim] = []
    for objective in ("mlm", "clm"):
        encodings = [
            e
            for e in sequence_encodings()
            if e != "none" and (objective == "clm" or not get_encoding(e).causal_only)
        ]
        claims += [Difference(objective, e, "none", "val_loss") for e in encodings]
        claims += [
            Difference(objective, e, "rope", "val_loss") for e in AGAINST_ROPE if e in encodings
        ]
        claims.append(Difference(objective, "rse", "stick_breaking", "val_loss"))
        claims += [Change(objective, e, "context_gain@7L") for e in ("none", *encodings)]
        claims += [
            Bound(objective, e, "shift_cost@7L", "above", 0.05) for e in ("absolute", "exposb")
        ]
        probed = encodings if objective == "mlm" else ["none", *encodings]
        claims += [Bound(objective, e, "word_order", "above", 0.6) for e in probed]
    for e in ("rope", "exposb"):
        claims.append(Bound("clm", e, "context_gain@1L", "below", 0.05))
        claims.append(Bound("clm", e, "context_gain@4L", "above", 0.05))
    clm = [e for e in sequence_encodings() if e != "none"]
    claims += [Bound("clm", e, "retrieval", "above", 0.3) for e in ("none", *clm)]
    claims += [Bound("clm", e, "retrieval", "above", 0.95) for e in ("rope", "exposb", "rse")]
    return tuple(claims)


def _ablation_claims() -> tuple[Claim, ...]:
    return tuple(
        Difference(objective, ablation.name, ablation.encoding, name)
        for ablation in ABLATIONS
        for objective in OBJECTIVES
        if ablation.trains(objective)
        for name in ablation.metrics
    )


def plateau_arms(results: list[dict], margin: float = PLATEAU_MARGIN) -> dict[str, float]:
    """The masked-LM arms that did not leave the unigram plateau: ``{arm: worst seed's test
    loss}`` for each arm with a seed whose loss is not ``margin`` below the unigram entropy of
    the training text."""
    stuck = {}
    for (objective, arm), runs in by_arm(results).items():
        if objective != "mlm":
            continue
        worst = max(metric(r, "val_loss") for r in runs)
        if worst > runs[0]["data"]["unigram_entropy_nats"] - margin:
            stuck[arm] = worst
    return stuck


def _arms_of(claim: Claim) -> tuple[str, ...]:
    return (claim.a, claim.b) if isinstance(claim, Difference) else (claim.arm,)


def declared_claims(results: list[dict]) -> tuple[Claim, ...]:
    """The declared claims (the ablations' and :func:`questions`) about arms that were run:
    each of its arms has a run in ``results`` under some objective. A claim about an arm with no
    run at all (registered after the runs were made) is not one of these results' questions
    yet: it joins with the arm's runs."""
    run = set(arms_run(results))
    declared = dict.fromkeys((*_ablation_claims(), *questions()))
    return tuple(c for c in declared if set(_arms_of(c)) <= run)


def uninformative_probes(results: list[dict]) -> dict[tuple[str, str], str]:
    """``{(objective, probe): why}`` for each probe with a position-blind floor (retrieval's
    bag-of-symbols guess) that no arm's mean accuracy clears: the probe then does not measure
    what positions add at this budget, and its claims would only make Holm's correction
    stricter for the others. (This rule was written after the committed runs were seen: every
    arm sat below the floor; the summary says which verdicts it changes.)"""
    floors: dict[tuple[str, str], float] = {}
    best: dict[tuple[str, str], float] = {}
    for (objective, _arm), runs in by_arm(results).items():
        for task, probe in runs[0].get("probes", {}).items():
            if "bag_of_symbols_baseline" not in probe:
                continue
            key = (objective, task)
            floors[key] = probe["bag_of_symbols_baseline"]
            mean = statistics.fmean(r["probes"][task]["accuracy"] for r in runs)
            best[key] = max(best.get(key, -1.0), mean)
    return {
        key: (
            f"no arm's mean clears the position-blind guess ({floors[key]:.3f}; best "
            f"{best[key]:.3f}): at this budget the probe does not measure position"
        )
        for key in floors
        if best[key] <= floors[key]
    }


def report_claims(results: list[dict], *, drop_idle_probes: bool = True) -> list[Claim]:
    """The family: the declared claims of :func:`declared_claims`, each kept when both its arms
    have runs of its objective with the metric, no loss claim on a masked-LM arm that did not
    leave the plateau, and no claim on a probe that measures nothing at this budget
    (:func:`uninformative_probes`; ``drop_idle_probes=False`` keeps those, to show what they
    would change)."""
    groups, stuck = by_arm(results), set(plateau_arms(results))
    idle = uninformative_probes(results) if drop_idle_probes else {}
    return [c for c in declared_claims(results) if _why_untested(c, groups, stuck, idle) is None]


def untested_questions(results: list[dict]) -> list[tuple[Claim, str]]:
    """The declared questions (:func:`questions`) about arms that were run
    (:func:`declared_claims`) that :func:`report_claims` leaves out, each with why: a masked-LM
    arm that did not leave the plateau (loss claims), an arm with no runs of the claim's
    objective (a partial run), a metric the runs record as not applicable (the learned table has
    no rows past the training length, so its far targets cannot be read), a probe no arm clears
    (:func:`uninformative_probes`), or a metric the preset does not measure. The ablations'
    claims are listed too. The summary lists them, so a declared claim never vanishes
    silently."""
    groups, stuck = by_arm(results), set(plateau_arms(results))
    idle = uninformative_probes(results)
    return [
        (claim, why)
        for claim in declared_claims(results)
        if (why := _why_untested(claim, groups, stuck, idle)) is not None
    ]


def _why_untested(
    claim: Claim, groups: dict, stuck: set, idle: dict[tuple[str, str], str]
) -> str | None:
    """Why ``claim`` cannot be tested on these runs (None: it can)."""
    arms = _arms_of(claim)
    if claim.objective == "mlm" and METRICS[claim.metric].kind == "loss" and stuck & set(arms):
        return "an arm did not leave the unigram plateau"
    if (claim.objective, claim.metric) in idle:
        return idle[claim.objective, claim.metric]
    for arm in arms:
        runs = groups.get((claim.objective, arm), ())
        if not runs:  # a partial run (--encodings, --seeds ...)
            return f"no {claim.objective} runs of {arm}"
        if all(metric(r, claim.metric) is None for r in runs):
            return _not_applicable(runs, claim.metric) or (
                f"the runs of {arm} have no {claim.metric} (not in this preset)"
            )
    return None


def _not_applicable(runs, name: str) -> str | None:
    """The recorded reason when every run's evaluation at metric ``name``'s length (``@7L``)
    is ``not_applicable``, else None."""
    if "@" not in name or not runs:
        return None
    tag = "@" + name.split("@", 1)[1]
    reasons = set()
    for r in runs:
        entries = [v for k, v in r.get("evaluation", {}).items() if k.endswith(tag)]
        missing = [e for e in entries if e.get("status") == "not_applicable"]
        if not missing:
            return None
        reasons.add(missing[0].get("reason", "not applicable"))
    return "; ".join(sorted(reasons))


# ---------------------------------------------------------------------------------------------
# Testing the family
# ---------------------------------------------------------------------------------------------


def _units_matrix(
    runs: list[dict], name: str, seeds: list[int]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(sums [seeds, U], counts [U])`` of metric ``name`` for ``seeds`` of one arm (None when
    the metric has no units, or the units differ between seeds)."""
    by_seed = {r["seed"]: r for r in runs}
    rows, counts = [], None
    for seed in seeds:
        units = metric_units(by_seed[seed], name)
        if units is None:
            return None
        sums, these = units
        if counts is None:
            counts = these
        elif list(these) != list(counts):
            return None
        rows.append(sums)
    return torch.tensor(rows, dtype=torch.float64), torch.tensor(counts, dtype=torch.float64)


def _bootstrap_se(
    values: torch.Tensor, counts: torch.Tensor, blocks: list[int] | None = None, seed: int = 0
) -> float:
    """Standard error of ``sum(values) / sum(counts)`` over units (``[U]`` each), by
    :data:`BOOTSTRAP_RESAMPLES` resamples with replacement (seeded): of the units, or, with
    ``blocks`` (the block of each unit: its document), of whole blocks, each drawn block
    bringing all its units (a block bootstrap: windows of one document are not independent)."""
    generator = torch.Generator().manual_seed(seed)
    if blocks is None:
        block_of = torch.arange(values.shape[0])
    else:
        block_of = torch.unique(torch.tensor(blocks), return_inverse=True)[1]
    n_blocks = int(block_of.max()) + 1
    picks = torch.randint(0, n_blocks, (BOOTSTRAP_RESAMPLES, n_blocks), generator=generator)
    drawn = torch.zeros(BOOTSTRAP_RESAMPLES, n_blocks, dtype=torch.float64)
    drawn.scatter_add_(1, picks, torch.ones_like(picks, dtype=torch.float64))
    weights = drawn[:, block_of]  # [resamples, units]: how often each unit's block was drawn
    estimates = (weights @ values) / (weights @ counts)
    return float(estimates.std())


def _blocks(runs: list[dict], name: str) -> list[int] | None:
    """The block of each unit of metric ``name``, the same in every run (None if any run does
    not record it, or the runs disagree)."""
    found = [metric_blocks(r, name) for r in runs]
    if not found or any(b is None or b != found[0] for b in found):
        return None
    return found[0]


def evaluation_se(results: list[dict], claim: Claim) -> float | None:
    """The bootstrap standard error, from the evaluation text alone, of the claim's estimate
    (the mean over seeds): per unit, the mean over the seeds both arms have of the summed
    difference (or value), resampled over units. None when the metric has no units."""
    groups = by_arm(results)
    if isinstance(claim, Difference):
        a = {r["seed"] for r in groups.get((claim.objective, claim.a), [])}
        b = {r["seed"] for r in groups.get((claim.objective, claim.b), [])}
        seeds = sorted(a & b)
        left = _units_matrix(groups[claim.objective, claim.a], claim.metric, seeds)
        right = _units_matrix(groups[claim.objective, claim.b], claim.metric, seeds)
        if left is None or right is None or left[1].shape != right[1].shape:
            return None
        if not torch.equal(left[1], right[1]):
            return None
        values, counts = (left[0] - right[0]).mean(0), left[1]
        runs = groups[claim.objective, claim.a] + groups[claim.objective, claim.b]
    else:
        runs = groups[claim.objective, claim.arm]
        units = _units_matrix(runs, claim.metric, sorted(r["seed"] for r in runs))
        if units is None:
            return None
        values, counts = units[0].mean(0), units[1]
    blocks = _blocks(runs, claim.metric)
    if blocks is not None and len(blocks) != values.shape[0]:
        raise ValueError(
            f"{claim.describe()}: the runs record {len(blocks)} documents for "
            f"{values.shape[0]} evaluation units"
        )
    return _bootstrap_se(values, counts, blocks)


def _values(results: list[dict], claim: Claim) -> dict[int, float]:
    runs = by_arm(results).get((claim.objective, claim.arm), [])
    return {r["seed"]: v for r in runs if (v := metric(r, claim.metric)) is not None}


def _test(results: list[dict], claim: Claim) -> tuple[float, tuple[float, float], float, int]:
    """``(estimate, 95% interval, uncorrected p, seeds)`` of one claim."""
    if isinstance(claim, Difference):
        diff = paired(results, claim.objective, claim.a, claim.b, claim.metric)
        if diff is None:
            raise ValueError(f"no seed has {claim.metric} for both arms of {claim.describe()}")
        return diff.mean, diff.ci(), diff.p_value, diff.n
    values = _values(results, claim)
    if not values:
        raise ValueError(f"no seed has {claim.metric} for {claim.describe()}")
    if isinstance(claim, Change):  # the values are within-run differences: test them against 0
        test = Paired(values)
        return test.mean, test.ci(), test.p_value, test.n
    bound = bound_test(values, claim.value, claim.side, METRICS[claim.metric].bounds)
    return bound.mean, bound.ci(), bound.p_value, len(values)


def judge(results: list[dict], claims: list[Claim] | None = None) -> dict[Claim, Verdict]:
    """Test every claim of the family (default :func:`report_claims`) and apply the verdict
    rule of the module docstring, Holm's correction over all of them at once."""
    claims = report_claims(results) if claims is None else list(claims)
    tested = [_test(results, c) for c in claims]
    adjusted = holm([t[2] for t in tested])
    verdicts = {}
    for claim, (estimate, ci, p, n), p_holm in zip(claims, tested, adjusted, strict=True):
        eval_se = evaluation_se(results, claim)
        if isinstance(claim, Bound):
            distance = estimate - claim.value if claim.side == "above" else claim.value - estimate
            effect_ok = distance > 0
            called = claim.side
            missing = "not shown"
        else:
            distance = abs(estimate)
            minimum = MIN_EFFECT.get(METRICS[claim.metric].kind, 0.0)
            effect_ok = distance >= minimum
            called = "lower" if estimate < 0 else "higher"
            missing = "within noise"
        noise_ok = eval_se is None or eval_se < distance / 4
        failed = []
        if not effect_ok:
            failed.append(f"the mean is not {claim.side} {claim.value:g}" if isinstance(claim, Bound)
                          else f"smaller than the minimum effect of {minimum:g}")  # fmt: skip
        if not noise_ok:
            share = f"{eval_se / distance:.2f}" if distance > 0 else "more than 0.25"
            failed.append(
                f"the test text's standard error is {share} of the estimate, a call needs under 0.25"
            )
        verdict = called if (p_holm < ALPHA and not failed) else missing
        verdicts[claim] = Verdict(
            claim, estimate, ci, p, p_holm, eval_se, n, verdict, failed=tuple(failed)
        )
    return verdicts


def spread_of_called(verdicts: dict[Claim, Verdict]) -> dict:
    """For the report: how many claims, how many called, and the largest ratio of the
    evaluation text's standard error to a called estimate's distance from zero or its bound."""
    called = [v for v in verdicts.values() if v.called]
    ratios = []
    for v in called:
        if v.eval_se is None:
            continue
        distance = (
            abs(v.estimate - v.claim.value) if isinstance(v.claim, Bound) else abs(v.estimate)
        )
        ratios.append(v.eval_se / distance)
    return {
        "claims": len(verdicts),
        "called": len(called),
        "largest_eval_se_ratio": max(ratios) if ratios else None,
        "median_eval_se_ratio": statistics.median(ratios) if ratios else None,
    }
