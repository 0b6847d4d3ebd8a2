"""``python -m klear.compare --config FILE --objectives A,B --seeds 0,1,2``: see :mod:`klear.compare.cli`."""

import sys

from klear.compare.cli import main

if __name__ == "__main__":
    sys.exit(main())
