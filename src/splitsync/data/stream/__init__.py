"""Streams for ``run.loader``: sharded per rank and worker, exactly resumable at any world size.

``splitsync.data.build`` decides what is a stream (``is_stream``, ``as_source``) and builds
the loader; this package holds its pieces.
"""

from __future__ import annotations

from splitsync.data.stream.loader import AT_END, SHARD_SHIFT, StreamLoader, sample_id
from splitsync.data.stream.readers import Layout, StreamReaders, choose_layout
from splitsync.data.stream.sources import Shards, Source

__all__ = ["SHARD_SHIFT", "sample_id", "Shards", "Source", "StreamLoader", "StreamReaders",
           "Layout", "choose_layout",
           "AT_END"]
