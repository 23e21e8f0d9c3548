"""Metrics clustered on (run, key, step), and per-run summaries of each key.

On SQLite the ``metrics`` table becomes ``WITHOUT ROWID``: rows live in the primary key's own
B-tree, in (run, key, step) order, so an insert writes one B-tree instead of three and reading one
run's key reads neighbouring pages. The ``(key, step)`` index, which no query uses, goes (on every
database). ``metric_summaries`` keeps, per (run, key), the row count, mean, min, max and last step:
reports read them instead of scanning every step of every run. A summary is a cache: any write of a
run's metrics deletes the run's summaries, and the run's end (or an import) writes them again.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_COLUMNS = ("run_id INTEGER NOT NULL, key_id INTEGER NOT NULL, step INTEGER NOT NULL, value FLOAT NOT NULL, "
            "PRIMARY KEY (run_id, key_id, step), FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE, "
            "FOREIGN KEY(key_id) REFERENCES metric_keys (id))")


def _rebuild_metrics(rowid: bool) -> None:
    """Copy the metrics into a table of the other layout (SQLite cannot change it in place)."""
    op.execute("DROP TABLE IF EXISTS metrics_new")  # left by an upgrade that was cut short
    op.execute(f"CREATE TABLE metrics_new ({_COLUMNS}{'' if rowid else ' WITHOUT ROWID'}")
    op.execute("INSERT INTO metrics_new (run_id, key_id, step, value) SELECT run_id, key_id, step, value FROM metrics")
    op.execute("DROP TABLE metrics")
    op.execute("ALTER TABLE metrics_new RENAME TO metrics")


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_metrics(rowid=False)  # (the copy has no (key, step) index)
    else:
        op.execute("DROP INDEX IF EXISTS ix_metrics_key_step")
    op.create_table(
        "metric_summaries",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("key_id", sa.Integer, sa.ForeignKey("metric_keys.id"), primary_key=True),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("mean", sa.Float),
        sa.Column("low", sa.Float),
        sa.Column("high", sa.Float),
        sa.Column("last_step", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("metric_summaries")
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_metrics(rowid=True)
    op.create_index("ix_metrics_key_step", "metrics", ["key_id", "step"])
