"""course_lib: the shared library of the positional-encodings course.

Importing it decides, once, where Triton kernels run (see :mod:`course_lib.runtime`).
"""

from course_lib.runtime import KERNEL_MODE, describe_kernel_mode, kernel_mode

# Registers every encoding (each module of course_lib.encodings registers its own record).
import course_lib.encodings  # noqa: E402, F401  (after runtime: kernels are decided first)

__all__ = ["KERNEL_MODE", "describe_kernel_mode", "kernel_mode"]
__version__ = "0.1.0"
