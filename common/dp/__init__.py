"""Differential privacy: accounting (pure math), mechanisms (noise), release specs, ledger."""
