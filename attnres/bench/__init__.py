"""``attnres bench``: measured side by side in one process, reported as ratios (never asserted by tests)."""
