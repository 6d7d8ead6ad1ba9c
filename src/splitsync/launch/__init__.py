"""Launching: options into a checked spec, torchrun's argv, the rendezvous, cluster defaults.

Submodules, each imported on its own (none imports torch at import time):

- ``launch.spec``: :class:`~splitsync.launch.spec.LaunchSpec` and ``build_spec`` (validation)
- ``launch.argv``: torchrun's command line for a spec
- ``launch.cluster``: defaults from a SLURM allocation or a PyTorchJob pod
- ``launch.rendezvous``: holding the rendezvous port, loopback-only stores
- ``launch.agent``: running torchrun's agent and explaining how it ended
- ``launch.notebook``: ``splitsync.launch(fn, nprocs=N)``, N local processes from a notebook

The package itself is callable: ``splitsync.launch(fn, nprocs=2, args=(...))`` forwards to
:func:`splitsync.launch.notebook.notebook_launch`, imported only when called.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__all__ = ["CallableModule"]


class CallableModule(types.ModuleType):
    """This package's module type: calling it runs ``notebook_launch``.

    A package named ``launch`` would otherwise hide a function ``splitsync.launch``; with a
    callable module both ``splitsync.launch(fn, nprocs=2)`` and ``splitsync.launch.spec``
    work.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        notebook = importlib.import_module(f"{self.__name__}.notebook")
        return notebook.notebook_launch(*args, **kwargs)


sys.modules[__name__].__class__ = CallableModule
