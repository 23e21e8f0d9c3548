"""Studies: ``attnres study`` launches stages of ``attnres next --launch`` until its scope's comparisons are
resolved, a budget is spent, or more seeds would not help.

A study is one row of ``studies``: its scope (with the baseline, the plan's parts and ``--max-seeds``), its
limits, its state (going, interrupted, ended), how it ended and what it spent, and the process driving it. Its
stages are the launches that name it in ``launches.study_id``, written when the launch is, so a study
continued after an interruption finds every stage it launched and launches none of them again.
``launches.study_id`` is a plain integer, as ``runs.launch_id`` is.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "studies",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("command_key", sa.String(64), nullable=False, index=True),
        sa.Column("scope_json", sa.Text, nullable=False),
        sa.Column("label", sa.Text, nullable=False),
        sa.Column("limits_json", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("end_reason", sa.String(32)),
        sa.Column("message", sa.Text),
        sa.Column("ended_at", sa.DateTime),
        sa.Column("runs_spent", sa.Integer, nullable=False),
        sa.Column("hours_spent", sa.Float, nullable=False),
        sa.Column("hours_carried", sa.Float, nullable=False),
        sa.Column("driver_host", sa.String(255)),
        sa.Column("driver_pid", sa.Integer),
        sa.Column("driver_since", sa.DateTime),
    )
    with op.batch_alter_table("launches") as batch:
        batch.add_column(sa.Column("study_id", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("launches") as batch:
        batch.drop_column("study_id")
    op.drop_table("studies")
