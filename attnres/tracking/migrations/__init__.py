"""Alembic migrations of the tracking database (run by `attnres db upgrade`)."""
