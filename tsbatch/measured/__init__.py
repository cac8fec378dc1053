"""Measured truth: accuracy against measured data, its metrics, GPU microbenchmarks and their calibration."""
