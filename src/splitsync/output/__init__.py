"""What a run reports: metrics, progress, throughput and trackers."""
