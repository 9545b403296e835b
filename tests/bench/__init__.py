"""Benchmarks (run by hand or by ``make bench``), not timed tests."""
