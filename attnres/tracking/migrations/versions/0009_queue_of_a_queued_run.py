"""The queue of a queued run: its host, process id and start time.

A queued run is started by a queue process (a foreground launch, a ``--detach`` queue, a resume). When that
process dies (a SIGKILL, a power cut), the run would stay queued forever, and a relaunch would answer
"already queued". With the queue's pid and start time recorded, as the trainer's are, a monitor tells a
live queue from a dead one (or from a later process that reused its pid) and sets the run aside as
preempted, which ``attnres resume`` and a relaunch continue.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("queue_host", sa.String(255)))
        batch.add_column(sa.Column("queue_pid", sa.Integer))
        batch.add_column(sa.Column("queue_since", sa.DateTime))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("queue_since")
        batch.drop_column("queue_pid")
        batch.drop_column("queue_host")
