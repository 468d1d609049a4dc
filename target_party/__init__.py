"""The target party: turns DP releases into an OT coupling and a local classifier."""
