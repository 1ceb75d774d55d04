"""``python -m redisstore``: the command line (see :mod:`redisstore.cli`)."""

import sys

from .admin.cli import main

sys.exit(main())
