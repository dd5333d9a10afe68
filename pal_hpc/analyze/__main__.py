"""`python -m pal_hpc.analyze` (see pal_hpc.analyze.cli)."""

import sys

from pal_hpc.analyze.cli import main

sys.exit(main())
