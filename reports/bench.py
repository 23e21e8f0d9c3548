"""``attnres bench report``: the document's generation timed over a synthetic database, in one process."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from attnres.bench.synthetic import synthetic_db
from attnres.errors import AttnresError
from attnres.tracking.db import get_engine
from reports.build import write_report


def bench_report(runs: int = 200, steps: int = 6000) -> dict[str, float]:
    """Time `attnres report` (without figures, then with) over a synthetic database."""
    if runs < 1 or steps < 1:
        raise AttnresError(f"--runs and --steps must be at least 1 (got {runs}, {steps})")
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        t0 = time.perf_counter()
        rows = synthetic_db(url, runs, steps)
        t_fill = time.perf_counter() - t0
        engine = get_engine(url)
        t0 = time.perf_counter()
        write_report(engine, Path(tmp) / "report.md", plots=False)
        t_report = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_report(engine, Path(tmp) / "report.md", plots=True)
        t_plots = time.perf_counter() - t0
    return {"runs": runs, "steps": steps, "metric_rows": rows, "fill_rows_per_s": rows / t_fill,
            "report_s": t_report, "report_with_plots_s": t_plots}
