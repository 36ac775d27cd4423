"""The closing experiment: the same mini BERT trained once per encoding and objective.

``run_comparison(preset)`` (or ``python -m course_lib.compare``) trains
:class:`~course_lib.model.MiniBert` for every encoding in :data:`course_lib.encodings.REGISTRY`
and every objective in ``mlm, clm`` with the same seed, data, steps and optimiser, evaluates each
model (loss at 1x, 2x and 4x the training length, the word-order and retrieval probes, cost),
saves one JSON file per run and draws the figures. One idea per module:

- :mod:`~course_lib.compare.presets`: the presets as data (:data:`PRESETS`: ``gpu``, ``cpu``,
  ``tiny``), :class:`Preset`, :class:`ProbeSpec`, :func:`choose_preset`;
- :mod:`~course_lib.compare.runner`: :func:`run_one` and :func:`run_comparison` (resumable),
  :func:`preset_results`;
- :mod:`~course_lib.compare.results`: where results live, :func:`load_results`,
  :func:`summary_markdown`;
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

from course_lib.compare.cli import main
from course_lib.compare.presets import (
    FORMAT_VERSION,
    OBJECTIVES,
    PRESETS,
    Preset,
    ProbeSpec,
    choose_preset,
)
from course_lib.compare.results import default_out_dir, load_results, summary_markdown
from course_lib.compare.runner import (
    hardware_description,
    preset_results,
    retrieval_bag_baseline,
    run_comparison,
    run_one,
)

__all__ = [
    "FORMAT_VERSION",
    "OBJECTIVES",
    "PRESETS",
    "Preset",
    "ProbeSpec",
    "choose_preset",
    "default_out_dir",
    "hardware_description",
    "load_results",
    "main",
    "preset_results",
    "retrieval_bag_baseline",
    "run_comparison",
    "run_one",
    "summary_markdown",
]
