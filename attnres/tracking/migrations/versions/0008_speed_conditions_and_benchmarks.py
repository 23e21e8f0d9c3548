"""Speed conditions and benchmarks: what a run's throughput depends on, and paired speed measurements.

A run's tokens/s measures its variant *and* the machine: the device model, the compute threads per
process, the world size, compilation and the autocast dtype. ``runs.conditions_json`` keeps them (a
list: one entry per distinct set of conditions its attempts trained under), so a report divides only
throughputs measured alike. Where they differ, the cost comes from ``benchmarks``: the rows of an
``attnres bench``, which times every variant against standard step by step in one process (drift in
machine speed cancels), named by its session, date, device and threads.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "benchmarks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session", sa.Integer, nullable=False, index=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("threads", sa.Integer, nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("preset", sa.String(64), nullable=False),
        sa.Column("overrides_json", sa.Text, nullable=False),
        sa.Column("variant", sa.String(64), nullable=False),
        sa.Column("n_layer", sa.Integer, nullable=False),
        sa.Column("d_model", sa.Integer, nullable=False),
        sa.Column("model_json", sa.Text, nullable=False),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("tokens_per_s", sa.Float, nullable=False),
        sa.Column("speed_ratio", sa.Float, nullable=False),
        sa.Column("speed_ratio_q1", sa.Float, nullable=False),
        sa.Column("speed_ratio_q3", sa.Float, nullable=False),
        sa.Column("peak_memory_bytes", sa.Float),
        sa.Column("saved_ratio", sa.Float, nullable=False),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("conditions_json", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("conditions_json")
    op.drop_table("benchmarks")
