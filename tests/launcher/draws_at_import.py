"""A module that draws from Python's, NumPy's and torch's global generators at import, as
rich does from ``random``: imported lazily by ``rng_script.py``, after a resume."""

import random

import numpy as np
import torch

random.getrandbits(24)
np.random.rand()
torch.rand(1)
