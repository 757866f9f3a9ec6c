"""Statistics of timing samples: intervals, estimates with their uncertainty, comparisons and
ties. scipy.stats does the statistics; this package says which statistic answers which
question. It imports nothing of the suite, so both sides (the runner's stopping rule, the
reading side's claims) and the benchmarks' gate use the same machinery."""
