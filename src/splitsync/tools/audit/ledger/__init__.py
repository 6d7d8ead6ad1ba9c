"""The sample ledger (``init(ledger=True)``) and what ``splitsync audit`` reads from it."""
