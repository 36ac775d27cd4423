"""Static GPU readiness of the course's Triton kernels, without a GPU.

* :mod:`.targets`: the GPUs that can be checked (sm_90 and sm_80 by default; sm_75, sm_86,
  sm_89, sm_100 and sm_120 on request), their per-block and per-SM limits, and the occupancy
  estimate.
* :mod:`.variants`: every launch the wrappers can issue, obtained by running the wrappers
  themselves on ``meta`` tensors inside :func:`course_lib.kernels.common.planned_launches`.
* :mod:`.aot`: ahead-of-time compilation of one launch for a target, registers and spills from
  ``ptxas -v``, shared memory, how each ``tl.dot`` is lowered.
* :mod:`.sass`: the loops of the machine code (natural loops, nested ones counted whole) and
  their instruction mix and spill traffic, turned into cycles per loop iteration with nominal
  per-SM throughputs, under two bounds (a static model: ratios, never times).
* :mod:`.model`: cycles per (query, key) pair of each kernel and ratios against recorded anchors.

:mod:`course_lib.gpu_report` drives them. Nothing here runs a kernel.
"""
