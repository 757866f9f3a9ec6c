"""Statistics of timing samples: intervals, estimates with their uncertainty, comparisons and
ties. scipy does the statistics (scipy.special's distributions, the functions scipy.stats
evaluates: ``distributions.py`` says why); this package says which statistic answers which
question. It imports nothing of the suite, so both sides (the runner's stopping rule, the
reading side's claims) and the benchmarks' gate use the same machinery."""
