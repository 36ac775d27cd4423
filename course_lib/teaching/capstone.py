"""Notebook 11's experiment and numbers: a small live comparison, and what a bias costs fused.

``live_comparison(arms)`` trains each arm on the ``tiny`` preset's data and model, causal LM, for
``steps`` steps, once per seed, and returns each arm's final validation loss per seed (the same
seeds for every arm, so differences can be paired). ``plot_live_comparison`` draws them, one line
per seed. ``table_path_cost()`` reads what the committed static GPU model says a bias read from a
table per distance costs, relative to plain flash attention (an estimate, not a time).
``live_seed(seed)`` is one seed of the notebook's live comparison, for
:mod:`course_lib.teaching.verdict_margins` (its :data:`VERDICTS`: the notebook's printed claims),
which measured how far they move between CPU kernel settings (``figures/11_verdict_margins.json``).
"""

from __future__ import annotations

import ast
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from tqdm.auto import tqdm

from course_lib.compare import PRESETS, run_one
from course_lib.teaching.scratch import write_encoding
from course_lib.teaching.seed_verdicts import SeedClaims
from course_lib.teaching.verdict_margins import Verdict

__all__ = [
    "VERDICTS",
    "live_comparison",
    "live_seed",
    "measured_table_path",
    "notebook_sandwich",
    "per_seed",
    "plot_live_comparison",
    "table_path_cost",
]

FIGURES = Path(__file__).resolve().parents[2] / "figures"


def _tiny_preset(steps: int):
    """The ``tiny`` preset (its model, data and learning rate) with ``steps`` steps, no probes."""
    tiny = PRESETS["tiny"]
    return replace(tiny, probes=(), train=replace(tiny.train, steps=steps))


def _final_loss(arm: str, objective: str, preset, seed: int, out_dir: str) -> float:
    result = run_one(arm, objective, preset, seed=seed, out_dir=out_dir, progress=False, threads=1)
    return result["metrics"]["final_val_loss"]


def live_comparison(
    arms: list[str], seeds: int = 5, steps: int = 60, objective: str = "clm"
) -> dict[str, list[float]]:
    """``{arm: [final validation loss of seed 0, 1, ...]}``: the ``tiny`` preset (its model, data
    and learning rate; no probes, no sweep), ``steps`` training steps, one torch thread."""
    if not arms or seeds < 2 or steps < 1:
        raise ValueError("give at least one arm, 2 seeds or more and at least 1 step")
    preset = _tiny_preset(steps)
    losses: dict[str, list[float]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as out, tqdm(total=len(arms) * seeds, desc="runs") as bar:
        for seed in range(seeds):
            for arm in arms:
                losses[arm].append(_final_loss(arm, objective, preset, seed, out))
                bar.update(1)
    return losses


def plot_live_comparison(losses: dict[str, list[float]], ax=None):
    """Each arm's final validation loss, one line per seed across the arms (a paired view)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    arms = list(losses)
    seeds = len(next(iter(losses.values())))
    for s in range(seeds):
        ax.plot(range(len(arms)), [losses[a][s] for a in arms], marker="o", alpha=0.6,
                label=f"seed {s}")  # fmt: skip
    ax.set_xticks(range(len(arms)), arms)
    ax.set_ylabel("final validation loss (causal LM)")
    ax.set_title("the same seeds under each encoding")
    ax.legend(fontsize=8, ncol=2)
    return ax


def table_path_cost(head_dim: int = 64) -> dict:
    """The committed static model's ratio of plain flash's speed to a kernel that reads its bias
    from a table per distance (sm_90, bf16, causal, forward + backward; below 1: slower than
    plain): ``{"no_overlap", "calibrated", "features"}``. An estimate, not a measured time."""
    from course_lib.gpu_static import calibrate

    report = json.loads((FIGURES / "gpu_report.json").read_text())
    calibrate.apply(report, calibrate.committed_params())
    for e in report["model"]:
        if (e["family"], e["causal"], e["dtype"], e["head_dim"]) != ("flash", True, "bf16",
                                                                   head_dim):  # fmt: skip
            continue
        # the table without far tiles: a torch-only bias that declares no distance_reach
        if e["features"] == "tables+gain+diagonal_table(grad)" and "error" not in e:
            return {"no_overlap": e["plain_x_no"], "calibrated": e.get("plain_x_cal"),
                    "features": e["features"]}  # fmt: skip
    raise LookupError(f"the committed report has no per-distance table row at head_dim {head_dim}")


def measured_table_path(methods: tuple[str, ...] = ("t5", "kerple")) -> dict:
    """What the committed H200 measurement says of encodings that read a table per distance:
    ``{"device", "commit", "plain_ms", method: (ms, times plain)}`` (forward + backward, 4096
    tokens, head_dim 64, bf16, causal; the kernels as they were at that commit)."""
    report = json.loads((FIGURES / "gpu_check" / "nvidia_h200.json").read_text())

    def ms(method: str) -> float:
        for r in report["speed"]:
            if (r["method"], r["contender"], r["seq"], r["head_dim"], r["dtype"], r["causal"],
                    r["pass_"]) == (method, "kernel", 4096, 64, "bf16", True, "fwd+bwd"):  # fmt: skip
                return r["ms"]
        raise LookupError(f"no H200 time of {method} in the committed report")

    plain = ms("softmax")
    out = {"device": report["meta"]["device"]["name"], "commit": report["meta"]["commit"],
           "plain_ms": plain}  # fmt: skip
    out.update({m: (ms(m), ms(m) / plain) for m in methods})
    return out


# -- how far the live comparison's verdicts move between CPUs ------------------------------------
#: The live comparison as notebook 11 runs it: its arms, seeds and steps.
LIVE_ARMS = ("sandwich", "rope", "alibi")
LIVE_SEEDS = 5
LIVE_STEPS = 60
NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "11_your_own_encoding.ipynb"


def notebook_sandwich() -> str:
    """The Sandwich encoding file notebook 11 writes (the ``SANDWICH = '''...'''`` of its cell),
    read from the notebook, so that what is measured here is what the learner runs."""
    notebook = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith("SANDWICH = '''"):
            for node in ast.parse(source).body:
                target = node.targets[0] if isinstance(node, ast.Assign) else None
                if isinstance(target, ast.Name) and target.id == "SANDWICH":
                    return ast.literal_eval(node.value)
    raise LookupError(f"no SANDWICH = '''...''' cell in {NOTEBOOK.name}")


def live_seed(seed: int) -> dict[str, float]:
    """``{arm: final validation loss}`` of one seed of notebook 11's live comparison (for
    :mod:`course_lib.teaching.verdict_margins`: one setting of CPU kernels per process)."""
    write_encoding("sandwich", notebook_sandwich())
    preset = _tiny_preset(LIVE_STEPS)
    with tempfile.TemporaryDirectory() as out:
        return {arm: _final_loss(arm, "clm", preset, seed, out) for arm in LIVE_ARMS}


def per_seed(losses: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """:func:`live_comparison`'s ``{arm: [per seed]}`` as ``{seed: {arm: loss}}``, the form
    :data:`VERDICTS` read (and :func:`live_seed` gives, one seed at a time)."""
    seeds = len(next(iter(losses.values())))
    return {str(s): {arm: values[s] for arm, values in losses.items()} for s in range(seeds)}


def _paired_high(other: str):
    """The upper end of notebook 11's interval of Sandwich minus ``other`` (2 claims,
    Bonferroni at a joint 95%): the verdict "lower" needs it below 0."""

    def high(values) -> float:
        seeds = sorted(values, key=int)
        sandwich, against = ([values[s][arm] for s in seeds] for arm in ("sandwich", other))
        return SeedClaims(family=2).paired(sandwich, against).high

    return high


def _worst_gap(other: str):
    """Sandwich minus ``other`` in the seed where Sandwich does worst: "lower in every seed"
    needs it below 0."""
    return lambda values: max(v["sandwich"] - v[other] for v in values.values())


#: Notebook 11's printed claims (the cell checks them with ``VERDICTS``, and
#: ``figures/11_verdict_margins.json`` measures how far each moves between CPU settings).
VERDICTS = tuple(
    verdict
    for other in ("rope", "alibi")
    for verdict in (
        Verdict(
            f"Sandwich minus {other}: the interval's upper end below 0",
            _paired_high(other),
            0.0,
            False,
        ),
        Verdict(f"Sandwich minus {other}: below 0 in every seed", _worst_gap(other), 0.0, False),
    )
)
