"""The comparison's arms: what one model of it is (an encoding, and maybe options of its module).

Every registered sequence encoding is an arm of its own name, with its module's defaults. The
:data:`ABLATIONS` are arms that change one thing of an encoding through its module's options
(``BertConfig.encoding_options``), each to answer one question the comparison raises; their
names are ``<encoding>.<change>``. An ablation is data here, not a new encoding: it adds no
entry to the registry, and its encoding's file already holds the option.

Saved results are read by the arms they hold (:func:`arms_run`), not by the registry: an
encoding registered after the runs were made (or an ablation added to a preset) has no runs yet,
and every reader of the saved results (the report, README's headline, notebook 10, their tests)
reads the arms that were run and lists the others as :class:`NotRunYet`, with the command that
runs them (:func:`run_command`), instead of failing.

An ablation trains with its encoding's learning rate (the one the preset's sweep chose for the
encoding, :mod:`course_lib.compare.sweep`): it is the encoding's recipe with one change. Its
``metrics`` are the questions it is asked: the comparison tests it against its encoding on those
(:mod:`course_lib.compare.claims`), and on nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from course_lib.model import OBJECTIVES
from course_lib.registry import get_encoding, sequence_encodings

__all__ = ["ABLATIONS", "Arm", "NotRunYet", "arm_names", "arms_run", "get_arm", "run_command"]


@dataclass(frozen=True)
class Arm:
    """One model of the comparison: ``encoding`` with ``options(train_len)`` passed to its
    module (None: the module's defaults). ``question``: what the arm isolates; ``metrics``: the
    metrics (:data:`course_lib.compare.stats.METRICS`) on which an ablation is compared with its
    encoding; ``objectives``: the objectives it is trained on (an ablation: those its question
    is about; a causal-only encoding has no masked-LM run whatever this says)."""

    name: str
    encoding: str
    question: str = ""
    options: Callable[[int], dict] | None = None
    metrics: tuple[str, ...] = ("val_loss",)  # what the ablation is tested on
    objectives: tuple[str, ...] = OBJECTIVES  # what it is trained on

    def trains(self, objective: str) -> bool:
        """Whether this arm has a run of ``objective``: one of its ``objectives``, and for the
        masked LM (which attends both ways) an encoding that is not causal only."""
        return objective in self.objectives and (
            objective == "clm" or not get_encoding(self.encoding).causal_only
        )

    def encoding_options(self, train_len: int) -> dict | None:
        """The module options of this arm for a model trained on ``train_len`` tokens."""
        return None if self.options is None else self.options(train_len)

    @property
    def is_ablation(self) -> bool:
        return self.name != self.encoding


def _dynamic_ntk(train_len: int) -> dict:
    return {
        "scaling": {
            "rope_type": "dynamic",
            "factor": 1.0,
            "original_max_position_embeddings": train_len,
        }
    }


def _fixed_penalty(value: float) -> Callable[[int], dict]:
    return lambda _: {"penalty_init": value, "learn_penalty": False}


#: What the penalty ablations are asked: the loss, far away with a long context, and the probes.
_PENALTY_METRICS = ("val_loss", "long@7L", "word_order", "retrieval")

#: The objective of the ablations whose questions are about causal models: reading past the
#: training length and retrieval (probed on causal runs only), as in chapters 06-07. Training
#: them on the masked LM too would double their cost for claims nobody asked.
_CAUSAL = ("clm",)

#: Ablations, in the order tables list them.
ABLATIONS: tuple[Arm, ...] = (
    Arm(
        "rope.dynamic",
        "rope",
        "RoPE read past its training length with dynamic NTK scaling (notebook 07's zero-shot "
        "rule that changes nothing in range); up to the training length it is plain RoPE, so it "
        "trains exactly like it",
        _dynamic_ntk,
        ("long@7L", "bucket0"),
        _CAUSAL,
    ),
    Arm(
        "rse.no_penalty",
        "rse",
        "RSE without its distance penalty (lambda = 0): RoPE + stick-breaking; what the penalty adds",
        _fixed_penalty(0.0),
        _PENALTY_METRICS,
        _CAUSAL,
    ),
    Arm(
        "rse.lambda_0.03",
        "rse",
        "RSE with its penalty fixed at lambda = 0.03 per byte in every head (a mild penalty: "
        "1.9 at the cpu preset's far end, 63 bytes back; 15 at the gpu preset's)",
        _fixed_penalty(0.03),
        _PENALTY_METRICS,
        _CAUSAL,
    ),
    Arm(
        "rse.lambda_0.3",
        "rse",
        "RSE with its penalty fixed at lambda = 0.3 per byte in every head (a strong one: keys "
        "beyond about 10 bytes lose most of their score)",
        _fixed_penalty(0.3),
        _PENALTY_METRICS,
        _CAUSAL,
    ),
    Arm(
        "rse.softmax",
        "rse",
        "RSE's scores (RoPE + the learned penalty, ALiBi-like) under softmax: what the stick adds",
        lambda _: {"normaliser": "softmax"},
        _PENALTY_METRICS,
        _CAUSAL,
    ),
    Arm(
        "rse.stick_bias",
        "rse",
        "RSE with a learned per-head stick bias starting at -3: every key breaks off a smaller "
        "share, so the stick reaches farther keys",
        lambda _: {"stick_bias_init": -3.0},
        ("val_loss", "word_order", "retrieval"),
        OBJECTIVES,  # word order fails on the masked runs (stick_reach), retrieval is causal
    ),
    Arm(
        "learned.unit_init",
        "learned",
        "the learned table started at std 1 (the scale of the states it is added to) instead "
        "of 0.02",
        lambda _: {"init_std": 1.0},
        ("val_loss", "word_order", "retrieval"),
        _CAUSAL,
    ),
    Arm(
        "kerple.power",
        "kerple",
        "KERPLE's power variant (-r1 |d|^r2, ALiBi with a learned slope and exponent) instead of "
        "the logarithmic one, which Chi et al. (2022) find better past the training length",
        lambda _: {"variant": "power"},
        ("val_loss", "long@7L"),
        _CAUSAL,
    ),
)


def arm_names() -> tuple[str, ...]:
    """Every arm: the registered sequence encodings (registry order), then the ablations."""
    return (*sequence_encodings(), *(a.name for a in ABLATIONS))


def get_arm(name: str) -> Arm:
    """The arm called ``name`` (an encoding's name, or an ablation's); an unknown name raises a
    ValueError listing the valid ones."""
    for ablation in ABLATIONS:
        if ablation.name == name:
            return ablation
    if name in sequence_encodings():
        get_encoding(name)
        return Arm(name, name)
    raise ValueError(f"unknown arm {name!r}; valid: {', '.join(arm_names())}")


def arms_run(results: Iterable[dict]) -> tuple[str, ...]:
    """The arms that have at least one run in ``results`` (under any objective), in
    :func:`arm_names` order; an arm that is no longer registered comes last, by name."""
    order = {name: i for i, name in enumerate(arm_names())}
    found = {r["arm"] for r in results}
    return tuple(sorted(found, key=lambda arm: (order.get(arm, len(order)), arm)))


def run_command(arm: str, preset: str = "cpu") -> str:
    """The command that trains every run of ``arm`` of ``preset`` into the preset's results
    folder: for an encoding its learning-rate sweep and then its seeds, for an ablation its
    seeds (at its encoding's rate, whose runs are read back). Runs already saved there are read
    back, not trained again."""
    spec = get_arm(arm)
    ablations = arm if spec.is_ablation else "none"
    return (
        f"python -m course_lib.compare --preset {preset} --encodings {spec.encoding} "
        f"--ablations {ablations}"
    )


@dataclass(frozen=True)
class NotRunYet:
    """An arm of a preset with no run among the saved results: registered (or added to the
    preset) after they were made. It is no failure: readers of the results leave it out until
    its runs are saved (``command``), and then its claims join the family."""

    arm: str
    preset: str = "cpu"

    @property
    def command(self) -> str:
        return run_command(self.arm, self.preset)

    def describe(self) -> str:
        return f"{self.arm}: not run yet (run it with `{self.command}`)"
