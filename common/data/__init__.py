"""Loaders, preprocessing and synthetic generators."""
