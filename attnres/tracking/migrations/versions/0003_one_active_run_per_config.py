"""One active run per config: a partial unique index on runs(config_hash) over queued and running rows.

Two launches of the same grid at the same moment could each plan a cell and insert it; with this
index the database refuses the second active run of a config, whatever the timing.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

ACTIVE = "status IN ('queued', 'running')"  # attnres.tracking.states.ACTIVE, as SQL


def upgrade() -> None:
    conn = op.get_bind()
    twins = conn.execute(sa.text(f"SELECT config_hash, COUNT(*) FROM runs WHERE {ACTIVE} "  # noqa: S608 - constants
                                 "GROUP BY config_hash HAVING COUNT(*) > 1")).all()
    if twins:
        ids = conn.execute(sa.text(f"SELECT id FROM runs WHERE {ACTIVE} AND config_hash IN :hashes "  # noqa: S608
                                   "ORDER BY id")
                           .bindparams(sa.bindparam("hashes", expanding=True)), {"hashes": [t[0] for t in twins]})
        raise RuntimeError("runs " + ", ".join(str(r[0]) for r in ids) + " are active twins (the same config "
                           "queued or running twice): `attnres kill` all but one, then upgrade again")
    op.create_index("ux_runs_active_config", "runs", ["config_hash"], unique=True,
                    sqlite_where=sa.text(ACTIVE), postgresql_where=sa.text(ACTIVE))


def downgrade() -> None:
    op.drop_index("ux_runs_active_config", table_name="runs")
