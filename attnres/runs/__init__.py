"""Running experiments: planning a launch into a grid, the orchestrator's verbs, backends, status."""

DEFAULT_BACKEND = "local"  # where runs execute unless --backend says otherwise (and a run recorded without one)
