"""Test-run settings shared by the unit tests and the notebooks run under nbval.

Notebook kernels inherit this process's environment: figures go to a temporary folder (the
committed ones in figures/ stay untouched) and exercise cells use the worked solutions.
"""

import os
import tempfile

os.environ.setdefault("COURSE_OUTPUT_DIR", tempfile.mkdtemp(prefix="course-test-output-"))
os.environ["COURSE_SOLUTIONS"] = "1"
os.environ.setdefault("TQDM_DISABLE", "1")
