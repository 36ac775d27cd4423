"""The course's speed goals, judged on the static model's pessimistic bound.

Each goal names the report rows it judges (family and feature label, as in
``figures/gpu_report.json``'s ``model``: causal, bf16, sm_90, forward + backward) and a floor per
head_dim for one ratio of the model:

* ``plain_x_no``: plain flash's cycles per pair over the row's, **no-overlap bound** (tensor
  cores and the rest take turns; in-loop spills charged);
* ``total_x_no``: the Triton tutorial's over the row's, same bound;
* ``sb_total_x``: the stick-breaking paper's kernel over the row's, **overlap** bound (the only
  one recorded for that kernel), in-loop spills charged to the course's kernel only.

A goal over several rows is judged on the worst of them. Two goals are not ratios: no kernel
spills inside its loops (:func:`loop_spills`), and stick-breaking's backward workspace stays
within 1.5x of flash's (:func:`workspace_ratios`). The model is static: a met goal says the
machine code leaves room for that speed, not that a GPU reached it. ``judge(...,
calibrated=params)`` judges the ``plain_x_no`` goals on ``plain_x_cal``, the model calibrated
against an H200's measured times (:mod:`.calibrate`), instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["GOALS", "Goal", "judge", "loop_spills", "workspace_ratios"]


@dataclass(frozen=True)
class Goal:
    """``name`` of what is judged, the ``rows`` ((family, features) pairs) it judges, the
    ``metric`` and its floor per head_dim (``floors``)."""

    name: str
    rows: tuple[tuple[str, str], ...]
    metric: str
    floors: dict[int, float]


_BIAS = "tables+gain+{}(grad)"  # a hook in its heaviest combination: RoPE tables, gain, gradient


def _at_most(times: float) -> dict[int, float]:
    """The floor on a ratio to plain flash for "at most ``times`` plain flash's time", at
    head_dim 64 and 128."""
    return {64: 1 / times, 128: 1 / times}


# Forward + backward, causal, bf16: a per-token transform costs at most 10% over plain flash
# (it is done once, outside the loops), ExpoSB's factor 30%; a bias that costs what it computes
# 10% (ALiBi, FoX), a table read per tile or a few operations per pair 30% (T5, judged as every
# course model runs it: positions stepping by a constant, so the per-distance table, whose tiles
# past the last bucket are one constant; KERPLE's hooks; the per-distance table of any other
# ``distance_bias``, which has no reach); the stick 50%, with RSE's penalty 70%.
GOALS = (
    Goal("plain flash vs the tutorial", (("flash", "plain"),), "total_x_no", {64: 0.9, 128: 0.9}),
    Goal("RoPE vs plain flash", (("flash", "tables"),), "plain_x_no", _at_most(1.1)),
    Goal(
        "ExpoSB vs plain flash",
        (("flash", "tables+gain+exposb_distance"),),
        "plain_x_no",
        _at_most(1.3),
    ),  # fmt: skip
    Goal(
        "linear distance bias (ALiBi, RSE's penalty) vs plain flash",
        (("flash", _BIAS.format("linear_distance")),),
        "plain_x_no",
        _at_most(1.1),
    ),
    Goal(
        "FoX's gates vs plain flash",
        (("flash", _BIAS.format("cumulative_log_gates")),),
        "plain_x_no",
        _at_most(1.1),
    ),  # fmt: skip
    Goal(
        "T5's buckets vs plain flash",
        (("flash", _BIAS.format("diagonal_table") + "+far"),),
        "plain_x_no",
        _at_most(1.3),
    ),  # fmt: skip
    Goal(
        "KERPLE (either variant) vs plain flash",
        (("flash", _BIAS.format("kerple_log")), ("flash", _BIAS.format("kerple_power"))),
        "plain_x_no",
        _at_most(1.3),
    ),  # fmt: skip
    Goal(
        "any other distance_bias (the per-distance table, no reach) vs plain flash",
        (("flash", _BIAS.format("diagonal_table")),),
        "plain_x_no",
        _at_most(1.3),
    ),  # fmt: skip
    Goal("stick-breaking vs plain flash", (("stick", "plain"),), "plain_x_no", _at_most(1.5)),
    Goal(
        "RSE vs plain flash",
        (
            ("stick", _BIAS.format("linear_distance")),
            ("stick", _BIAS.format("offset_linear_distance")),
        ),
        "plain_x_no",
        _at_most(1.7),
    ),  # fmt: skip
    Goal(
        "RSE vs the stick-breaking paper's kernel",
        (
            ("stick", _BIAS.format("linear_distance")),
            ("stick", _BIAS.format("offset_linear_distance")),
        ),
        "sb_total_x",
        {64: 1.0, 128: 1.0},
    ),  # fmt: skip
)


def _rows(rep: dict, family: str, features: str, head_dim: int) -> list[dict]:
    return [
        e for e in rep["model"]
        if e["family"] == family and e["features"] == features and e["head_dim"] == head_dim
        and e["causal"] and e["dtype"] == "bf16" and "error" not in e
    ]  # fmt: skip


def judge(rep: dict, goals=GOALS, calibrated: dict | None = None) -> list[dict]:
    """One verdict per (goal, head_dim): ``goal``, ``head_dim``, ``value`` (the worst row's
    ratio), ``floor``, ``met``, ``short_by`` (floor - value, 0 when met), ``row`` (the worst
    row's features) and ``bound`` (its forward's busiest classes). A goal whose rows the report
    lacks (or whose ratio it cannot form: a calibrated one without plain flash's kernels) is
    reported with ``value`` None and ``met`` False.

    ``calibrated``: parameters of :mod:`.calibrate` (e.g. ``calibrate.committed_params()``):
    the goals on ``plain_x_no`` are judged on ``plain_x_cal`` instead, the model calibrated
    against a GPU's times (:func:`.calibrate.apply`, on a copy of the report's rows)."""
    if calibrated is not None:
        from course_lib.gpu_static import calibrate

        rep = dict(rep, model=[dict(e) for e in rep["model"]])
        calibrate.apply(rep, calibrated)
        goals = tuple(
            replace(g, metric="plain_x_cal") if g.metric == "plain_x_no" else g for g in goals
        )
    out = []
    for goal in goals:
        for d, floor in goal.floors.items():
            # a calibrated ratio needs plain flash in the report too (a --filter can drop it)
            found = [e for fam, feat in goal.rows for e in _rows(rep, fam, feat, d)
                     if goal.metric in e]  # fmt: skip
            if not found:
                out.append(dict(goal=goal.name, head_dim=d, value=None, floor=floor, met=False,
                                short_by=None, row=None, bound=None))  # fmt: skip
                continue
            worst = min(found, key=lambda e: e[goal.metric])
            value = worst[goal.metric]
            out.append(dict(
                goal=goal.name, head_dim=d, value=value, floor=floor, met=value >= floor,
                short_by=max(floor - value, 0.0), row=f"{worst['family']} {worst['features']}",
                bound=worst["bounds"].get("forward"),
            ))  # fmt: skip
    return out


def loop_spills(rep: dict) -> list[dict]:
    """Every modelled kernel (sm_90, every mask and head_dim) that loads or stores spilled
    registers inside its busiest loop: ``row`` (family, features, mask, head_dim), ``kernel``
    and ``local`` (spill accesses per iteration)."""
    out = []
    for e in rep["model"]:
        if "error" in e:
            continue
        for kernel, facts in e["occupancy"].items():
            if facts.get("local"):
                mask = "causal" if e["causal"] else "bidir"
                out.append(dict(row=f"{e['family']} {e['features']} {mask} D{e['head_dim']}",
                                kernel=kernel, local=facts["local"]))  # fmt: skip
    return out


def workspace_ratios(rep: dict) -> list[dict]:
    """Stick-breaking's backward workspace over plain flash's at the same mask and head_dim
    (bf16, sm_90 rows), for plain stick-breaking and for each of its hooks with a gradient:
    ``row``, ``causal``, ``head_dim``, ``ratio`` (goal: at most 1.5)."""
    flash = {
        (e["causal"], e["head_dim"]): e["workspace_bwd"]
        for e in rep["model"]
        if e["family"] == "flash" and e["features"] == "plain" and e["dtype"] == "bf16"
    }
    out = []
    for e in rep["model"]:
        if e["family"] != "stick" or e["dtype"] != "bf16" or "error" in e:
            continue
        base = flash.get((e["causal"], e["head_dim"]))
        if base:
            out.append(dict(row=f"stick {e['features']}", causal=e["causal"],
                            head_dim=e["head_dim"], ratio=e["workspace_bwd"] / base))  # fmt: skip
    return out
