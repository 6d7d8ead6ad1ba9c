"""Names the dead-code check (vulture) cannot see used: entry points and public API that only
users' code, the interpreter or another library calls. One line each, with why. This file is
read by vulture, never run."""

# ruff: noqa
_ = object()

__getattr__  # splitsync/__init__.py: module __getattr__, the lazy top-level names (PEP 562)
__dir__  # splitsync/__init__.py: module __dir__ (PEP 562)
_.median_ms, _.p90_ms, _.ratio, _.ratio_lo, _.ratio_hi  # bench LoopSummary: results.json fields
CORPUS  # check/measured.py: the corpus the precision table was measured on (--explain, tests)
_.total_size  # data/loader.py ShardSampler: DistributedSampler's attribute, read by users' code
_.global_order  # data/loader.py ShardSampler: the whole pass in order, for users' checks
worker_id  # distributed/seeding.py worker_init_fn: DataLoader's calling convention
_.num_nodes  # distributed/env.py DistEnv: public, the number of machines
_.to_device  # run/runtime.py Run: a public verb
_.main_process_first  # run/collectives.py CollectiveVerbs: a public verb of the Run
_.sync_batchnorm_stats  # run/collectives.py CollectiveVerbs: a public verb of the Run
_.require_backward_grad_sync  # strategies/ddp.py: DDP's own flag, read by DDP in forward
_._has_rebuilt_buckets  # strategies/ddp.py: DDP's own flag, read by its ZeRO comm hook
_.__doc__  # api.py: init's keyword reference, set after the function so that init fits a screen
_.writable  # ckpt/integrity.py HashingWriter: io.RawIOBase protocol
_.replica_group  # run/runtime.py Run: a public property, read by users' scripts
_.per_timeline  # tools/goodput/report.py GoodputReport: a field of `splitsync goodput --json`
grad_outputs  # train/empty.py _zeros: a backward hook's argument, by torch's calling convention
ft_heartbeat_ms, ft_timeout, ft_lighthouse  # api.py init: keywords read through locals() into the settings
