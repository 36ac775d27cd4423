"""course_lib: the shared library of the positional-encodings course.

Importing it decides, once, where Triton kernels run (see :mod:`course_lib.runtime`), and
registers every encoding (each module of :mod:`course_lib.encodings` registers its own record).
Neither imports a Triton kernel: those are loaded when the Triton backend is first used.
"""

import course_lib.encodings  # noqa: F401
from course_lib.runtime import KERNEL_MODE, describe_kernel_mode, kernel_mode

__all__ = ["KERNEL_MODE", "describe_kernel_mode", "kernel_mode"]
__version__ = "0.1.0"
