"""`python -m pagedserve serve ...` (same as the `pagedserve` console script)."""

from __future__ import annotations

import sys

from pagedserve.cli import main

if __name__ == "__main__":
    sys.exit(main())
