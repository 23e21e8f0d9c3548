"""The MLflow mirror: one attnres run as one MLflow run, through ``MlflowClient`` (no fluent, process-global API).

The client is used rather than ``mlflow.start_run`` because the fluent API keeps an active-run stack per thread and
a global tracking URI, which would clash with the user's own MLflow use in the same process; a client carries its
URI and run id itself, so it is safe from any thread.

``import mlflow`` below is an absolute import (Python 3): it is the installed package, never this module.
"""

from __future__ import annotations

import time

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking import MlflowClient

from attnres.mirrors import IDENTITY_TAG, RunInfo, Target
from attnres.tracking import states

# MLflow's limits on one log_batch call and on one value (mlflow.utils.validation): over them it raises
MAX_METRICS = 1000
MAX_PARAMS = 100
MAX_TAGS = 100
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
# attnres's final word -> MLflow's run status; preempted and running are absent: the run stays RUNNING to be resumed
STATUS = {states.FINISHED: "FINISHED", states.DIVERGED: "FINISHED", states.STOPPED: "FINISHED",
          states.KILLED: "KILLED", states.FAILED: "FAILED"}


def _chunks(items: list, size: int) -> list[list]:
    """``items`` in consecutive pieces of at most ``size`` (MLflow rejects bigger batches)."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def _quoted(value: str) -> str:
    """``value`` as a string literal of MLflow's search syntax, which has no escapes: pick a quote it does not hold."""
    for quote in ("'", '"'):
        if quote not in value:
            return f"{quote}{value}{quote}"
    raise ValueError(f"a run identity cannot hold both quote characters: {value!r}")


class MlflowMirror:
    """Mirrors a run to MLflow: experiment ``run.experiment``, the run found again by its ``attnres.identity`` tag.

    ``target.where`` is the tracking URI; ``None`` leaves it to MLflow (``MLFLOW_TRACKING_URI``, else its default).
    """

    buffered = False  # log_batch returns once the store holds the points

    def __init__(self, target: Target) -> None:
        self.target = target
        self._client: MlflowClient | None = None
        self._run_id: str | None = None

    def open(self, run: RunInfo) -> None:
        """Create the MLflow run, or continue the one tagged with ``run.identity`` (adding only params it lacks).

        A param cannot change value on an MLflow run (it raises), so a continued run keeps the values it has.
        """
        client = MlflowClient(self.target.where) if self.target.where else MlflowClient()
        experiment_id = self._experiment_id(client, run.experiment)
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`{IDENTITY_TAG}` = {_quoted(run.identity)}",
            max_results=1, order_by=["attributes.start_time ASC"],
        )
        tags = {key: value[:MAX_TAG_VALUE] for key, value in {**run.tags, IDENTITY_TAG: run.identity}.items()}
        params = {key: value[:MAX_PARAM_VALUE] for key, value in run.params.items()}
        if found:
            existing = found[0]
            run_id = existing.info.run_id
            params = {key: value for key, value in params.items() if key not in existing.data.params}
            for part in _chunks([RunTag(key, value) for key, value in tags.items()], MAX_TAGS):
                client.log_batch(run_id, tags=part)
            if existing.info.status != "RUNNING":
                client.update_run(run_id, "RUNNING")  # MLflow's status (a resume); end() sets the final one
        else:
            run_id = client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
        for part in _chunks([Param(key, value) for key, value in params.items()], MAX_PARAMS):
            client.log_batch(run_id, params=part)
        self._client, self._run_id = client, run_id

    @staticmethod
    def _experiment_id(client: MlflowClient, name: str) -> str:
        """The id of experiment ``name``, created if missing; another process creating it at the same time is fine."""
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return client.create_experiment(name)
        except MlflowException as e:
            if e.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def log(self, rows: list[tuple[int, dict[str, float]]]) -> None:
        """Send every point with ``log_batch``, at most 1000 metrics a call (one call per value is far too slow).

        Non-finite values are sent as they are (MLflow's SQL store keeps NaN, and keeps +/-inf as +/-max float).
        """
        client, run_id = self._opened()
        now = int(time.time() * 1000)
        metrics = [Metric(key, float(value), now, int(step)) for step, values in rows for key, value in values.items()]
        for part in _chunks(metrics, MAX_METRICS):
            client.log_batch(run_id, metrics=part)

    def end(self, status: str) -> None:
        """Set the MLflow status for attnres's ``status`` (FINISHED / KILLED / FAILED); preempted or running stay
        RUNNING. The attnres word itself goes in the ``attnres.status`` tag, since MLflow has no "diverged"."""
        client, run_id = self._opened()
        client.set_tag(run_id, "attnres.status", status)
        if status in STATUS:
            client.set_terminated(run_id, STATUS[status])

    def _opened(self) -> tuple[MlflowClient, str]:
        """The client and run id, or an error if :meth:`open` has not run (a bug in the caller)."""
        if self._client is None or self._run_id is None:
            raise RuntimeError("MlflowMirror.open() was not called")
        return self._client, self._run_id
