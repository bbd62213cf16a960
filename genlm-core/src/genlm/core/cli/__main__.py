"""``python -m genlm.core.cli``: the same as the ``genlm`` script."""

import sys

from genlm.core.cli import main

sys.exit(main())
