"""The Run: one training session, its parts, config, accumulation and profiling."""
