"""``python -m course_lib.compare``: see :mod:`course_lib.compare.cli`."""

import sys

from course_lib.compare.cli import main

sys.exit(main())
