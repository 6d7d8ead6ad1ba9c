"""Reading checkpoints offline, in one process without a process group: ``splitsync ckpt
inspect``, ``convert`` and ``verify``, their readers (:mod:`.reading`, :mod:`.dcpread`) and
writers (:mod:`.writers`)."""
