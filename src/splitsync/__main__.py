"""``python -m splitsync``."""

from splitsync.cli import main

raise SystemExit(main())
