"""``python -m redisstore``: the command line (see :mod:`redisstore.cli`)."""

import sys

from .cli import main

sys.exit(main())
