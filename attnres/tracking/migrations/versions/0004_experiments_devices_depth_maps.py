"""Experiments, devices and depth-attention maps.

``runs.experiment`` names the experiment a run belongs to (runs made before get their preset's
name, what ``attnres launch`` derives by default); ``runs.device`` says what trained it. The
``depth_weights`` table keeps, per eval, each depth-attention site's mean softmax weight on each
of its sources.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("experiment", sa.String(128), nullable=False, server_default=""))
        batch.add_column(sa.Column("device", sa.String(128)))
    op.execute("UPDATE runs SET experiment = preset WHERE experiment = ''")
    op.create_index("ix_runs_experiment", "runs", ["experiment"])
    op.create_table(
        "depth_weights",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("site", sa.Integer, primary_key=True),
        sa.Column("source", sa.String(32), primary_key=True),
        sa.Column("weight", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("depth_weights")
    op.drop_index("ix_runs_experiment", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("device")
        batch.drop_column("experiment")
