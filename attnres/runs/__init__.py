"""Running experiments: planning a launch into a grid, the orchestrator's verbs, backends, status."""
