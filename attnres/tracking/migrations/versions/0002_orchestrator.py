"""Orchestrator columns: backend, agent pid, SLURM job id, early-stop rule.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("backend", sa.String(16), nullable=False, server_default="local"))
        batch.add_column(sa.Column("agent_pid", sa.Integer))
        batch.add_column(sa.Column("job_id", sa.String(64)))
        batch.add_column(sa.Column("rule_json", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for col in ("rule_json", "job_id", "agent_pid", "backend"):
            batch.drop_column(col)
