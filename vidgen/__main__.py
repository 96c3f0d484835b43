"""``python -m vidgen`` runs the command line."""

import sys

from vidgen.cli import main

sys.exit(main())
