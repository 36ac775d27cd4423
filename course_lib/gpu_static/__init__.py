"""Static GPU readiness of the course's Triton kernels, without a GPU.

* :mod:`.targets`: the two GPUs checked (H100 = sm_90, A100 = sm_80), their per-block and per-SM
  limits, and the occupancy estimate.
* :mod:`.variants`: every launch the wrappers can issue, obtained by running the wrappers
  themselves on ``meta`` tensors inside :func:`course_lib.kernels.common.planned_launches`.
* :mod:`.aot`: ahead-of-time compilation of one launch for a target, registers and spills from
  ``ptxas -v``, shared memory, how each ``tl.dot`` is lowered.
* :mod:`.sass`: the inner loops of the machine code and their instruction mix, turned into cycles
  per loop iteration with nominal per-SM throughputs (a static model: ratios, never times).
* :mod:`.model`: cycles per (query, key) pair of each kernel and ratios against recorded anchors.

:mod:`course_lib.gpu_report` drives them. Nothing here runs a kernel.
"""
