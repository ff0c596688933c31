"""``python -m specdec.drill``: see :mod:`specdec.drill.cli`."""

import sys

from specdec.drill.cli import main

sys.exit(main())
