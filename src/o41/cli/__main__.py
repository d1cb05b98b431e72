"""``python -m o41.cli``: the ``o41`` command."""

import sys

from o41.cli import main

if __name__ == "__main__":
    sys.exit(main())
