"""Mirrors and end-of-run notifications.

``runs.mirrors_json`` lists the trackers (MLflow, trackio, W&B) a run's metrics are also sent to, and
``runs.on_end_json`` the command run when the run ends (an argument list): both are chosen at launch
and kept with the run, so a resumed or requeued attempt does the same. ``mirror_marks`` says, per run,
mirror and key, the last step the mirror holds: what is past it is what is left to send.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("mirrors_json", sa.Text))
        batch.add_column(sa.Column("on_end_json", sa.Text))
    op.create_table(
        "mirror_marks",
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("target", sa.String(512), primary_key=True),
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("step", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("mirror_marks")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("on_end_json")
        batch.drop_column("mirrors_json")
