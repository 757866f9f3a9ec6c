"""The collectives sweep (message_size): blocks of calls timed back to back, and its console
table as nccl-tests prints it."""
