"""Entry point of a ``splitsync check`` worker process: ``python -m splitsync.check.worker``
(see :mod:`splitsync.check.pool`). Kept apart so that the package never imports it."""

from __future__ import annotations

from splitsync.check.pool import worker_main

if __name__ == "__main__":
    worker_main()
