"""Training arithmetic the Run applies: precision, clipping, stale optimizers, SyncBatchNorm."""
