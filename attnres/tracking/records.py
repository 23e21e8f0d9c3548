"""Runs and studies as plain values: what :class:`attnres.tracking.run_store.RunStore` returns instead of ORM rows,
and the words their rows hold beside a run's states (:mod:`attnres.tracking.states`): a stage's origin, a study's
state.

A record is the run as it was read, detached from any session: it can be passed to a backend, a mirror or
another process's code without a database behind it, and nothing changes the run through it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path

#: how a stage (a launch: the runs one command created) came about
LAUNCH, NEXT, IMPORT, RESUME, DIRECT = "launch", "next", "import", "resume", "direct"
#: a study's states (not a run's)
GOING, INTERRUPTED, ENDED = "going", "interrupted", "ended"


@dataclass(frozen=True)
class RunRecord:
    """One run as recorded: the columns of the ``runs`` table, as values (not a row bound to a session).
    ``tests/test_run_store.py`` checks the fields against the table."""

    id: int
    variant: str
    seed: int
    preset: str
    data: str
    config_json: str
    config_hash: str
    status: str
    total_steps: int
    step: int
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    heartbeat_at: datetime | None
    pid: int | None
    host: str | None
    git_commit: str | None
    world_size: int
    exit_code: int | None
    stop_step: int | None
    message: str | None
    log_path: str | None
    backend: str
    agent_pid: int | None
    job_id: str | None
    rule_json: str | None
    experiment: str
    device: str | None
    mirrors_json: str | None
    on_end_json: str | None
    launch_id: int | None
    conditions_json: str | None
    queue_host: str | None
    queue_pid: int | None
    queue_since: datetime | None
    placement_json: str | None

    @classmethod
    def of(cls, row: object) -> RunRecord:
        """The record of an ORM row (or anything with the columns as attributes)."""
        return cls(**{f.name: getattr(row, f.name) for f in fields(cls)})

    @property
    def spool(self) -> Path:
        """Where the run's spool lives: beside its log."""
        from attnres import paths

        return paths.spool_of(Path(self.log_path) if self.log_path else paths.run_log(self.id))


@dataclass(frozen=True)
class StudyRecord:
    """A study as recorded: its row as values, with the ids of its stages (launches), oldest first."""

    id: int
    created_at: datetime
    command_key: str
    scope: dict
    label: str
    limits: dict
    state: str
    end_reason: str | None
    message: str | None
    ended_at: datetime | None
    runs_spent: int
    hours_spent: float
    hours_carried: float  # device-hours of its runs' attempts before the study resumed them (their start is replaced)
    driver_host: str | None
    driver_pid: int | None
    driver_since: datetime | None
    stages: tuple[int, ...]
