"""Entry point of a ``splitsync check`` worker process: ``python -m splitsync.tools.lint.worker``
(see :mod:`splitsync.tools.lint.pool`). Kept apart so that the package never imports it."""

from __future__ import annotations

from splitsync.tools.lint.pool import worker_main

if __name__ == "__main__":
    worker_main()
