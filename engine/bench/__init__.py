"""Benchmarks run by ``bunshin bench ...``: every comparison in one process, reported as JSON, table and plot."""
