"""The rules of ``splitsync check``, one function each, grouped by topic.

Each module exposes ``RULES``: a tuple of :class:`splitsync.check.model.Rule`.
SS1xx devices, SS2xx process groups and launching, SS3xx data, SS4xx seeds,
SS5xx per-rank output, SS6xx the training loop.
"""
