"""Progress bars of the runs a launch or a resume waits on."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from attnres.cli.app import console

if TYPE_CHECKING:
    from attnres.tracking.run_store import RunStore


class RunBars:
    """Progress bars of the runs a submission waits on, shown from its first tick (a detached queue
    or a cluster submission never ticks, so it shows none)."""

    def __init__(self, store: RunStore) -> None:
        self.store, self.ids, self.progress, self.tasks = store, [], None, {}

    def watch(self, ids: list[int]) -> Callable[[], None]:
        self.ids = ids
        return self.tick

    def tick(self) -> None:
        if self.progress is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self.progress = Progress(*columns, console=console)
            self.progress.start()
            for rid in self.ids:
                run = self.store.run(rid)
                self.tasks[rid] = self.progress.add_task(f"run {rid} {run.variant} s{run.seed}", total=run.total_steps)
        for rid, task in self.tasks.items():
            self.progress.update(task, completed=self.store.run(rid).step)

    def close(self) -> None:
        if self.progress is not None:
            try:
                self.tick()
            finally:
                self.progress.stop()
                self.progress = None
