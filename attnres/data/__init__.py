"""Corpora, tokenization, shard preparation and the training loader."""
