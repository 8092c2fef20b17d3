"""Benchmarking DSpark drafts: prompt sets, metrics, calibration, baselines, report, plots."""
