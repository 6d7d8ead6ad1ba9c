"""``splitsync audit``: reads the sample ledger back and reports per epoch what was trained once, twice or never."""
