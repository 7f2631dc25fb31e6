"""`python -m speclm`: the `speclm` command."""

import sys

from .commands import main

sys.exit(main())
