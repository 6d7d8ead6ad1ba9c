"""Preemption, in one room: where a stop request comes from, how the ranks agree on the
step to stop after, what the launcher reads, and SLURM's requeue.

- :mod:`~splitsync.preemption.settings`: ``init``'s preemption settings, checked once, and
  the sources they ask for;
- :mod:`~splitsync.preemption.sources`: the ``Source`` protocol; signals, a stop file;
- :mod:`~splitsync.preemption.slurm`: SLURM's source, which requeues a stopped job;
- :mod:`~splitsync.preemption.watch`: the thread that waits for a request and the deadline;
- :mod:`~splitsync.preemption.board`: the agreement on the stop step, in the job's store;
- :mod:`~splitsync.preemption.exit`: the exit code and the notes ``splitsync run`` reads;
- :mod:`~splitsync.preemption.requeue`: putting a stopped SLURM job back in the queue;
- :mod:`~splitsync.preemption.defaults`: the settings' defaults and checks, which the
  launcher's signal list and shutdown timeout are built from.

The Run's side (arm at ``run.resume``, stop after the agreed step, save) is
``splitsync.run.preempt``.
"""
