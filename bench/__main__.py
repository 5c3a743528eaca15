"""``python -m bench …``: the benchmarks and fault drills of a source checkout."""

import sys

from bench.cli import main

sys.exit(main())
