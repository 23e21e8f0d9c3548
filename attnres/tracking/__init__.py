"""Run and metric tracking over SQLAlchemy 2 (SQLite with WAL by default, any URL otherwise)."""
