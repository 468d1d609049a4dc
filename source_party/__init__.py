"""The source party: holds private labeled data and emits only DP releases."""
