"""`python -m dataflow.cli ...`: the `dataflow` command."""

import sys

from dataflow.cli import main

sys.exit(main())
