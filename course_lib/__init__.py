"""course_lib: the shared library of the positional-encodings course.

Importing it decides, once, where Triton kernels run (see :mod:`course_lib.runtime`: first, so
that ``course_lib.kernels`` is this checkout's and ``TRITON_INTERPRET`` is set before any Triton
function is decorated), then registers every encoding (each module of
:mod:`course_lib.encodings` registers its own record, with its score-bias hooks where Triton is
installed). The kernel families themselves are loaded when the Triton backend is first used.
"""

from course_lib.runtime import KERNEL_MODE, describe_kernel_mode, kernel_mode  # isort: skip
import course_lib.encodings  # noqa: F401

__all__ = ["KERNEL_MODE", "describe_kernel_mode", "kernel_mode"]
__version__ = "0.1.0"
