"""Measurement: the one cold-run protocol, the profiler's cost table, the tuner, narrow-weight error."""
