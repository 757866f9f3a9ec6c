"""The run context: who and where this rank is (backend, device, process group), the run
folder set up, resumed and closed, the scheduler's job."""
