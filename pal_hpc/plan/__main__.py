"""`python -m pal_hpc.plan` (see pal_hpc.plan.cli)."""

import sys

from pal_hpc.plan.cli import main

sys.exit(main())
