"""``python -m distilserve.server.cli``: the ``distilserve`` command."""

import sys

from distilserve.server.cli import main

sys.exit(main())
