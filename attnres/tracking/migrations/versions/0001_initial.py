"""The first schema: runs, metric_keys, metrics, meta.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("variant", sa.String(64), nullable=False, index=True),
        sa.Column("seed", sa.Integer, nullable=False),
        sa.Column("preset", sa.String(64), nullable=False),
        sa.Column("data", sa.String(512), nullable=False),
        sa.Column("config_json", sa.Text, nullable=False),
        sa.Column("config_hash", sa.String(16), nullable=False, index=True),
        sa.Column("status", sa.String(16), nullable=False, index=True),
        sa.Column("total_steps", sa.Integer, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("started_at", sa.DateTime), sa.Column("ended_at", sa.DateTime),
        sa.Column("heartbeat_at", sa.DateTime), sa.Column("pid", sa.Integer),
        sa.Column("host", sa.String(255)), sa.Column("git_commit", sa.String(64)),
        sa.Column("world_size", sa.Integer, nullable=False), sa.Column("exit_code", sa.Integer),
        sa.Column("stop_step", sa.Integer), sa.Column("message", sa.Text), sa.Column("log_path", sa.String(1024)),
    )
    op.create_table("metric_keys", sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
                    sa.Column("name", sa.String(128), nullable=False, unique=True))
    op.create_table(
        "metrics",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("key_id", sa.Integer, sa.ForeignKey("metric_keys.id"), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("value", sa.Float, nullable=False),
    )
    op.create_index("ix_metrics_key_step", "metrics", ["key_id", "step"])
    op.create_table("meta", sa.Column("key", sa.String(64), primary_key=True),
                    sa.Column("value", sa.String(255), nullable=False))


def downgrade() -> None:
    for table in ("meta", "metrics", "metric_keys", "runs"):
        op.drop_table(table)
