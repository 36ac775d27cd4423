import sys

from course_lib.gpu_check.cli import main

sys.exit(main())
