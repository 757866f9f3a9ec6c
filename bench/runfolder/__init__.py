"""The run folder, the one interface between the side that runs and the side that reads:
its columns, its points record, its schema version, and how both are written and read."""
