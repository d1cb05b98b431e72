"""``python -m o41.webhook.collections``: the collections alone (tests, benchmarks)."""

import sys

from o41.webhook.collections.standalone import main

if __name__ == "__main__":
    sys.exit(main())
