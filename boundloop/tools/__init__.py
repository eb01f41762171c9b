"""Tools: the registry (declarations) and the demo tools over SQLite."""
