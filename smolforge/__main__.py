"""``python -m smolforge`` — same as the ``smolforge`` command (used by the pipeline runner)."""
import sys

from smolforge.cli import main

if __name__ == "__main__":
    sys.exit(main())
