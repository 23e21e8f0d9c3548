"""Launches: which runs were started together, and what a planned launch pre-registered.

Every ``attnres launch``, ``attnres next --launch`` and ``attnres import`` records one row in
``launches``, and each run it creates keeps its id in ``runs.launch_id`` (a resumed or requeued run
keeps its own). The runs of one launch are one stage of an experiment: a report tests a comparison
when a stage is complete, and counts each stage that added seeds to it as one more look at the data
(sequential testing). A launch made by ``attnres next`` keeps its plan (the comparisons it is meant
to resolve and the seeds per arm it planned) in ``plan_json``: the pre-registration a report holds
the test to. Runs recorded before this revision have no launch: they count as one first stage.

``runs.launch_id`` is a plain integer, not a foreign key: a run rebuilt from its spool after its
database was lost keeps the stage it belongs to even where the launch row is gone.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "launches",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("plan_json", sa.Text),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("launch_id", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("launch_id")
    op.drop_table("launches")
