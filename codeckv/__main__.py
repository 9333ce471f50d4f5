"""python -m codeckv: the command line (codeckv/cli/)."""

import sys

from codeckv.cli import main

if __name__ == "__main__":
    sys.exit(main())
