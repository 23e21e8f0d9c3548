"""Tables of the tracking database.

Metrics are long-format rows keyed by (run, metric key, step), with the metric name interned
in ``metric_keys`` so that the hot table holds four numbers a row: compact, fast to insert in
batches, and ordered for the reads a report makes (one run's key, chosen steps).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ACTIVE_SQL = "status IN ('queued', 'running')"  # checked against states.ACTIVE by tests/test_states.py


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    variant: Mapped[str] = mapped_column(String(64), index=True)
    seed: Mapped[int] = mapped_column(Integer)
    preset: Mapped[str] = mapped_column(String(64))
    data: Mapped[str] = mapped_column(String(512), default="builtin")
    config_json: Mapped[str] = mapped_column(Text)
    config_hash: Mapped[str] = mapped_column(String(16), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True)  # see attnres.tracking.states
    total_steps: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer, default=0)  # last completed step
    created_at: Mapped[datetime] = mapped_column(DateTime)
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    git_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    world_size: Mapped[int] = mapped_column(Integer, default=1)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    stop_step: Mapped[int | None] = mapped_column(Integer, nullable=True)  # diverged/stopped at
    message: Mapped[str | None] = mapped_column(Text, nullable=True)  # why it ended, last log lines
    log_path: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    backend: Mapped[str] = mapped_column(String(16), default="local")  # local | slurm | inline (a REGISTRY name)
    agent_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)  # torchrun's process (group)
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # SLURM job id
    rule_json: Mapped[str | None] = mapped_column(Text, nullable=True)  # early-stop rule, if any
    experiment: Mapped[str] = mapped_column(String(128), index=True, default="")  # what reports group by
    device: Mapped[str | None] = mapped_column(String(128), nullable=True)  # what trained it, e.g. "cpu"
    mirrors_json: Mapped[str | None] = mapped_column(Text, nullable=True)  # trackers it is also sent to (specs)
    on_end_json: Mapped[str | None] = mapped_column(Text, nullable=True)  # command run when it ends (argv)
    launch_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the launch (stage) that created it
    # what its tokens/s depends on, per distinct set its attempts trained under (attnres.tracking.speed)
    conditions_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    # the queue process that will start it, while it is queued (migration 0009): a dead one strands the run
    queue_host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    queue_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    queue_since: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    placement_json: Mapped[str | None] = mapped_column(Text, nullable=True)  # how its launch placed it (resume)

    # one active (queued or running: attnres.tracking.states.ACTIVE) run per config, whoever launches it
    __table_args__ = (Index("ux_runs_active_config", "config_hash", unique=True,
                            sqlite_where=text(ACTIVE_SQL), postgresql_where=text(ACTIVE_SQL)),)


class Launch(Base):
    """One ``attnres launch``, ``next --launch`` or ``import``: the runs it created are one stage.

    A report tests a comparison once a stage is complete and counts each stage that added seeds to it
    as one look (sequential testing); ``plan_json`` keeps what ``attnres next`` pre-registered: the
    comparisons a launch is meant to resolve and the seeds per arm it planned.
    """

    __tablename__ = "launches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    origin: Mapped[str] = mapped_column(String(16))  # launch | next | import | resume | direct
    plan_json: Mapped[str | None] = mapped_column(Text, nullable=True)  # next's pre-registration
    study_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the study it is a stage of (0011)


class Study(Base):
    """One ``attnres study``: stages of ``attnres next --launch`` until its scope's comparisons are resolved, a
    budget is spent or more seeds would not help (migration 0011). Its stages are the launches that name it.

    Recorded before its first stage, with the driver process that works on it, so that an interrupted study is
    continued (``--resume ID``, or the same command: ``command_key``) without launching a stage twice.
    """

    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    command_key: Mapped[str] = mapped_column(String(64), index=True)  # a digest of the command that started it
    scope_json: Mapped[str] = mapped_column(Text)  # the scope it plans in, baseline, parts and --max-seeds
    label: Mapped[str] = mapped_column(Text)  # the scope in words
    limits_json: Mapped[str] = mapped_column(Text)  # --max-runs, --max-hours, --deadline, --max-stages
    state: Mapped[str] = mapped_column(String(16))  # going | interrupted | ended (attnres.tracking.studies)
    end_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)  # how it ended or stopped, in words
    ended_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    runs_spent: Mapped[int] = mapped_column(Integer)
    hours_spent: Mapped[float] = mapped_column(Float)  # device-hours: each run's wall time x its ranks
    hours_carried: Mapped[float] = mapped_column(Float)  # of the attempts of its runs before the study resumed them
    driver_host: Mapped[str | None] = mapped_column(String(255), nullable=True)  # the process driving it now
    driver_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    driver_since: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class Benchmark(Base):
    """One variant's row of an ``attnres bench`` session: its speed relative to standard, timed step by step
    against it in one process, and its saved activations relative to standard (migration 0008).

    A report takes a variant's speed cost from here when the runs it compares trained under different
    conditions: a ratio from one paired session is like with like, tokens/s recorded apart are not.
    """

    __tablename__ = "benchmarks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session: Mapped[int] = mapped_column(Integer, index=True)  # the rows of one `attnres bench`
    created_at: Mapped[datetime] = mapped_column(DateTime)
    device: Mapped[str] = mapped_column(String(128))  # the device model, as runs record it
    threads: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(16))
    preset: Mapped[str] = mapped_column(String(64))
    overrides_json: Mapped[str] = mapped_column(Text)
    variant: Mapped[str] = mapped_column(String(64))
    n_layer: Mapped[int] = mapped_column(Integer)
    d_model: Mapped[int] = mapped_column(Integer)
    model_json: Mapped[str] = mapped_column(Text)  # the variant's whole model config: what a run must match
    steps: Mapped[int] = mapped_column(Integer)
    tokens_per_s: Mapped[float] = mapped_column(Float)
    speed_ratio: Mapped[float] = mapped_column(Float)  # median of paired step-time ratios, standard / variant
    speed_ratio_q1: Mapped[float] = mapped_column(Float)
    speed_ratio_q3: Mapped[float] = mapped_column(Float)
    peak_memory_bytes: Mapped[float | None] = mapped_column(Float, nullable=True)  # CUDA only
    saved_ratio: Mapped[float] = mapped_column(Float)  # saved activations / standard's


class MetricKey(Base):
    __tablename__ = "metric_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)


class Metric(Base):
    __tablename__ = "metrics"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key_id: Mapped[int] = mapped_column(ForeignKey("metric_keys.id"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    value: Mapped[float] = mapped_column(Float)

    # SQLite keeps the rows in the primary key's B-tree, in (run, key, step) order: one B-tree per insert,
    # and one run's key on neighbouring pages (migration 0005)
    __table_args__ = ({"sqlite_with_rowid": False},)


class MetricSummary(Base):
    """Per (run, key): row count, mean, min, max and last step of its values, so reports need not scan them.

    A cache: any write of a run's metrics deletes the run's summaries (:mod:`attnres.tracking.run_rows`),
    and the run's end or an import writes them again; a report computes what is missing.
    """

    __tablename__ = "metric_summaries"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key_id: Mapped[int] = mapped_column(ForeignKey("metric_keys.id"), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    mean: Mapped[float | None] = mapped_column(Float, nullable=True)  # (None: no value was a number)
    low: Mapped[float | None] = mapped_column(Float, nullable=True)
    high: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_step: Mapped[int] = mapped_column(Integer)


class DepthWeight(Base):
    """A depth-attention map: at an eval, a site's mean softmax weight on one of its sources.

    ``site`` is a step's input (0-based; the last is the readout before the final norm); ``source``
    names what it attends to: ``embedding``, ``block K``, ``partial`` or ``recent J`` (newest first).
    """

    __tablename__ = "depth_weights"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    site: Mapped[int] = mapped_column(Integer, primary_key=True)
    source: Mapped[str] = mapped_column(String(32), primary_key=True)
    weight: Mapped[float] = mapped_column(Float)


class MirrorMark(Base):
    """How far a run's metrics reached one mirror: per key, the last step it holds.

    A mirror is sent only what is past its marks, so a resumed run, a second sender or `attnres sync
    --mirror` never sends a point twice; a point not sent (the mirror was down) is sent by the next one.
    """

    __tablename__ = "mirror_marks"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    target: Mapped[str] = mapped_column(String(512), primary_key=True)  # the mirror's spec, e.g. mlflow=URI
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    step: Mapped[int] = mapped_column(Integer)


class Meta(Base):
    """Key/value facts about the database itself (pre-Alembic files kept their version here)."""

    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))
