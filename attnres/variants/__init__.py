"""The variant registry (registry.py), each variant's traits, and what `attnres variants` shows."""
