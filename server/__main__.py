"""``python -m server serve ...``: the same entry point as the ``specdec`` console script."""

import sys

from server.cli import main

sys.exit(main())
