"""``python -m cuquant``: the same command line as ``cuquant``."""

import sys

from .cli import main

sys.exit(main())
