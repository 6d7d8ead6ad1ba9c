"""Training through a failure without a restart: replica groups under torchft.

``init(fault_tolerance="torchft")`` gives the Run a :class:`~splitsync.ft.part.FaultTolerance`
part (the Run delegates what differs to it, see ``splitsync.run.tolerance``): this process
is one rank of one replica group (its torchrun world); the groups agree on each step through
torchft's Lighthouse and a :class:`torchft.Manager` per group, a dead group's peers discard
the step it spoiled and train on without it, and a restarted group receives the weights, the
optimizer state and the data position from a peer.

Rooms:

- ``ft.options``: what ``init(ft_...=)`` and the launcher's environment say (pure);
- ``ft.manager``: the one place that imports torchft (lazily) and builds the Manager;
- ``ft.hooks``: the gradient hooks (DDP comm hook, FSDP all-reduce hook) that average across
  groups, with torchft 0.2.0's DDP hook assert worked around;
- ``ft.cursor``: the global data cursor and the lineage of committed steps (pure);
- ``ft.steps``: one step's quorum and commit;
- ``ft.loader``: batches handed out from the cursor after each quorum;
- ``ft.part``: the part of the Run that ties them together.
"""
