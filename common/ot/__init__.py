"""Regularized optimal transport: costs, solvers, barycentric mapping. No networking."""
