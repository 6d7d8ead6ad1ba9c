"""``splitsync goodput``: the clock a run keeps (:mod:`~splitsync.tools.goodput.clock`, attached by
``init``) and the report that reads it back (:mod:`~splitsync.tools.goodput.report`)."""
