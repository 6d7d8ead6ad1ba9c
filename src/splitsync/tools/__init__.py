"""Tools that observe the core (guards, verify, stragglers) or read code and machines (lint, plan, bench, envreport)."""
