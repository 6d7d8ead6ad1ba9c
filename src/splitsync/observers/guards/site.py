"""Where in the user's code a call came from: the first frame outside torch and splitsync."""

from __future__ import annotations

import os
import sys
import sysconfig
from types import FrameType

__all__ = ["user_site", "is_library_file", "library_dirs"]

# this file is splitsync/observers/guards/site.py: three levels up is the package itself
_SPLITSYNC_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def library_dirs() -> tuple[str, ...]:
    # the standard library too: a rank blocked in queue.get or threading is at the user's
    # line that called into it
    dirs = [_SPLITSYNC_DIR + os.sep, sysconfig.get_paths()["stdlib"] + os.sep]
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None and getattr(torch_mod, "__file__", None):
        dirs.append(os.path.dirname(os.path.abspath(torch_mod.__file__)) + os.sep)
    return tuple(dirs)


def is_library_file(filename: str, dirs: tuple[str, ...] | None = None) -> bool:
    """True for frames inside torch, splitsync or the interpreter's frozen modules."""
    if filename.startswith("<"):
        return True
    return os.path.abspath(filename).startswith(dirs or library_dirs())


def _short(filename: str) -> str:
    path = os.path.abspath(filename)
    cwd = os.getcwd() + os.sep
    return path[len(cwd):] if path.startswith(cwd) else path


def user_site(frame: FrameType | None = None) -> str:
    """``file:line`` of the innermost frame that belongs to the user's code ("?" if none)."""
    dirs = library_dirs()
    f = frame if frame is not None else sys._getframe(1)
    while f is not None:
        if not is_library_file(f.f_code.co_filename, dirs):
            return f"{_short(f.f_code.co_filename)}:{f.f_lineno}"
        f = f.f_back
    return "?"
