"""The rules of ``splitsync check``, one function each, grouped by topic.

Each rule module lists its own rules in ``RULES`` (a tuple of
:class:`splitsync.check.model.Rule`) and :data:`splitsync.check.registry.RULE_MODULES` names
the modules; helpers several of them read are in :mod:`splitsync.check.rules.common`.
SS1xx devices, SS2xx process groups and launching, SS3xx data, SS4xx seeds,
SS5xx per-rank output, SS6xx the training loop.
"""
