"""The run directory: who owns it and its config record, the files controllers write into it
(rolled back on resume), and a run's closing summary."""
