"""Planning: the sweep table and the frozen point records a run resolves. Torch-free: the
command line validates a sweep before any process starts."""
