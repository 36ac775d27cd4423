"""The closing experiment: the same mini BERT trained once per encoding, objective and seed.

``run_comparison(preset)`` (or ``python -m course_lib.compare``) trains
:class:`~course_lib.model.MiniBert` for every sequence encoding in
:data:`course_lib.encodings.REGISTRY`, the preset's ablations (one module option changed, e.g.
RSE without its penalty) and every objective in ``mlm, clm``, once per seed, with the same data,
steps and optimiser; evaluates each model (loss at the training length, by position bucket past
it, and at 2x and 4x on the same targets; the word-order and retrieval probes; learned values;
cost); saves one JSON file per run and draws the figures and tables, every one with the spread
over seeds. One idea per module:

- :mod:`~course_lib.compare.presets`: the presets as data (:data:`PRESETS`: ``gpu``, ``cpu``,
  ``tiny``), :class:`Preset`, :class:`ProbeSpec`, :func:`choose_preset`;
- :mod:`~course_lib.compare.arms`: what one model of the comparison is, and the ablations;
- :mod:`~course_lib.compare.plan`: the runs of a comparison in the order they are made, and an
  estimate of the minutes those left take;
- :mod:`~course_lib.compare.runner`: :func:`run_comparison`, stage by stage (resumable, and in
  slices of a time budget): :mod:`~course_lib.compare.sweep` (the learning-rate sweep),
  :mod:`~course_lib.compare.training_run` (:func:`run_one`, one run trained),
  :mod:`~course_lib.compare.evaluation` (what a trained run is scored on),
  :mod:`~course_lib.compare.report` (:func:`preset_results`, :func:`write_report`), with what
  they share in :mod:`~course_lib.compare.common`; :mod:`~course_lib.compare.timing` measures
  speed on its own;
- :mod:`~course_lib.compare.stats`: spread over seeds, paired differences and their verdicts;
- :mod:`~course_lib.compare.results`: where results live, :func:`load_results`,
  :func:`summary_markdown`, README's headline;
- :mod:`~course_lib.compare.figures`: the figures, one ``plot_*`` function each, coloured by
  each encoding's ``color`` in the registry;
- :mod:`~course_lib.compare.cli`: :func:`main`, the command line (``__main__`` runs it).

Under ``torchrun`` (``torchrun --nproc_per_node N -m course_lib.compare ...``) the comparison
uses N processes (:mod:`course_lib.distributed`): ``--parallel data`` (default) trains each run
with all of them, ``--parallel runs`` gives each process whole runs. Without ``torchrun`` it is
one process and creates no process group.

The committed results of the ``cpu`` preset are in ``figures/compare_cpu/``.
"""

from __future__ import annotations

from course_lib.compare.arms import ABLATIONS, get_arm
from course_lib.compare.cli import main
from course_lib.compare.common import hardware_description
from course_lib.compare.evaluation import retrieval_bag_baseline
from course_lib.compare.presets import (
    FORMAT_VERSION,
    OBJECTIVES,
    PRESETS,
    Preset,
    ProbeSpec,
    choose_preset,
)
from course_lib.compare.report import preset_results, write_report
from course_lib.compare.results import default_out_dir, load_results, summary_markdown
from course_lib.compare.runner import run_comparison
from course_lib.compare.training_run import run_one

__all__ = [
    "ABLATIONS",
    "FORMAT_VERSION",
    "OBJECTIVES",
    "PRESETS",
    "Preset",
    "ProbeSpec",
    "choose_preset",
    "default_out_dir",
    "get_arm",
    "hardware_description",
    "load_results",
    "main",
    "preset_results",
    "retrieval_bag_baseline",
    "run_comparison",
    "run_one",
    "summary_markdown",
    "write_report",
]
