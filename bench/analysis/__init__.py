"""Trace analysis: Kineto traces in, DataFrames out (reader, intervals, breakdown, collectives,
folder of ranks). It reads traces and nothing of the side that runs sweeps, nor the report."""
