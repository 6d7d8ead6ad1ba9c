"""``splitsync check``: static rules for data-parallel mistakes, read from a script's AST.

Nothing is imported or executed from the checked scripts, and torch is never imported, so the
checker runs anywhere in milliseconds. One rule is one function (see ``splitsync.check.rules``).
"""

from __future__ import annotations

from splitsync.check.model import SEVERITIES, Finding, Hit, Rule
from splitsync.check.registry import all_rules, get_rule, select_rules
from splitsync.check.runner import check_file, check_paths, check_source, iter_python_files

__all__ = ["SEVERITIES", "Finding", "Hit", "Rule", "all_rules", "get_rule", "select_rules",
           "check_source", "check_file", "check_paths", "iter_python_files"]
