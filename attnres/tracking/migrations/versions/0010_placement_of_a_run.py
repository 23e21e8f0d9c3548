"""How a run was placed: its launch's placement (ranks, GPUs per run, nodes, GPUs per node, partition, time
limit, backend options), as JSON.

``attnres resume`` continues a run through the backend it ran on; without its placement a run launched on
two nodes with eight GPUs each would come back as a one-node job, on the cluster's default partition.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("placement_json", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("placement_json")
