"""``splitsync verify``: self-test of the installation and data-parallel check of a script.

- :mod:`splitsync.tools.verify.selftest` / :mod:`splitsync.commands.verify_worker`: collectives on every
  backend, 1-vs-N training equality, checkpoint round trip.
- :mod:`splitsync.tools.verify.record`: what a script run under ``verify`` records (switched on by
  ``SPLITSYNC_VERIFY_DIR``, read once by ``init()``; nothing is recorded otherwise).
- :mod:`splitsync.tools.verify.script`: runs the script at 1 and N processes and diffs the records.
"""
