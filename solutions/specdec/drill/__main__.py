"""``python -m specdec.drill``: see :mod:`specdec.drill.cli`."""

import os
import sys

from specdec.drill.cli import main

try:
    sys.exit(main())
except BrokenPipeError:  # the reader stopped early (`--list | head`): not an error of the drill
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
