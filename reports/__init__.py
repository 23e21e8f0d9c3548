"""Report generation: pure functions from DataFrames to markdown and figures."""
