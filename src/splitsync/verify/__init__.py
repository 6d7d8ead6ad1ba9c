"""``splitsync verify``: self-test of the installation and data-parallel check of a script.

- :mod:`splitsync.verify.selftest` / :mod:`splitsync.verify.worker`: collectives on every
  backend, 1-vs-N training equality, checkpoint round trip.
- :mod:`splitsync.verify.record`: what a script run under ``verify`` records (switched on by
  ``SPLITSYNC_VERIFY_DIR``, read once by ``init()``; nothing is recorded otherwise).
- :mod:`splitsync.verify.script`: runs the script at 1 and N processes and diffs the records.
"""
