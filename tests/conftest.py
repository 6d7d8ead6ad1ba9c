"""Shared test settings: single-threaded BLAS so multi-rank tests do not fight for cores."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
