"""Triton kernels of the course, one family per module.

This folder holds only `@triton.jit` code and its launch helpers. It knows nothing of
`course_lib`; `course_lib` wraps these kernels as autograd functions. It is installed as the
subpackage `course_lib.kernels` (see pyproject.toml), which can never be shadowed by the
unrelated `kernels` package on PyPI.
"""
