"""python -m codeckv: the command line (codeckv/cli/)."""

import sys

try:
    from codeckv.cli import main
except KeyboardInterrupt:  # Ctrl-C while the modules load ends as Ctrl-C later does (cli/__init__.py)
    print("interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
