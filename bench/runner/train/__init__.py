"""The training sweep: its loop, one point's harness, the step, the data, and the check of
each point against the plain model."""
