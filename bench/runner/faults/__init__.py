"""The fault machinery both runners use: the watchdog, torch's flight recorder, hang capture,
the launcher's loss and a failed point's root cause. It imports no other room."""
