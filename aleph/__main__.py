"""`python -m aleph` is the same as the `aleph` console script."""

import sys

from aleph.cli import main

if __name__ == "__main__":
    sys.exit(main())
