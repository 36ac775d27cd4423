"""The GPU check in one command: ``python -m course_lib.gpu_check``.

On a CUDA GPU, in one run (planned for under 15 minutes on an H100):

1. **correctness** (:mod:`.correctness`): every method of ``attention()`` (plain softmax and
   every registered encoding that acts inside attention, enumerated from the registry) through
   ``attention(..., backend="triton")`` against ``backend="reference"`` in float64, forward and
   backward (q, k, v and every learned tensor the method takes), in fp32, fp16 and bf16 (where
   the GPU has bf16 tensor cores), causal and bidirectional, at a ragged length;
2. **speed** (:mod:`.speed`): the kernels against what a user would pick instead, PyTorch's
   SDPA, the encoding's PyTorch transform followed by SDPA, or FlexAttention with the
   encoding's own bias as a ``score_mod`` (a bias that depends on the distance only; compiled
   once, with a causal ``BlockMask``), forward and forward + backward at several lengths, with
   peak memory; FlexAttention with no ``score_mod`` is timed against SDPA too, and below half
   SDPA's speed every comparison with FlexAttention is reported as unreliable;
3. **notebooks** (:mod:`.notebooks`): the notebooks that time the kernels, under nbval;
4. **training** (:mod:`.training`): a short run of the ``gpu`` preset's comparison (one seed,
   a few hundred steps: a smoke run, not a comparison).

It writes one JSON report and one figure under ``figures/gpu_check/``, named by the device
(:mod:`.report`), prints a summary, and exits 1 if a kernel disagrees with the reference, a
notebook fails or a training run does not train; timings never fail it. Without a GPU it says
so and exits 2 (:mod:`.device`). This check has not been run on a GPU yet: no GPU figure of
the course comes from it so far.

:func:`course_lib.gpu_check.cli.main` is the command.
"""
