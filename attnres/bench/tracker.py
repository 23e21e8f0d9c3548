"""``attnres bench tracker``: the tracker's own speed beside raw sqlite3, measured in one process.

Four measures, each on a fresh SQLite file in a temporary folder:

* **ingest**: ``rows`` metric values (5 keys a step, a run update each step) through the trainer's
  writer, timed from the moment they are handed over until the database holds them
  (:meth:`MetricWriter.flush`), beside raw ``sqlite3`` ``executemany`` of the same rows into the
  same table in another file, in the same run;
* **logging call**: what one logged step costs the training thread (the trainer's recorder:
  ``record`` of the 5 values and ``progress``, its writer and heartbeat threads running), p50 and p99;
* **report**: the whole document (without, then with figures) over ``report_runs`` x
  ``report_steps`` x 5 metric rows;
* **status**: the whole ``attnres status`` process over ``status_runs`` runs, beside ``attnres --help``;
* **growth**: the report and status again at ``grow`` times the runs, and the ratio of the times;
* **paper scale**: the report and status over a database the size of the results document's study
  (:mod:`attnres.bench.paper`), in SQLite and, with a server, in PostgreSQL.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from attnres.errors import AttnresError
from attnres.tracking import check_server, raw_sqlite_insert_s, scratch_database
from attnres.tracking.run_store import RunStore

KEYS = ("train_loss", "lr", "grad_norm", "tokens_per_s", "peak_memory_bytes")
ReportWriter = Callable[..., object]  # reports.build.write_report(store, out, plots=...)


def _new_run(url: str, tmp: Path, status: str = "finished") -> tuple[RunStore, int]:
    from attnres.tracking import states
    from attnres.variants.registry import resolve_run

    store = RunStore(url)
    cfg = resolve_run("standard", "tiny", 1, [f"steps={10**9}"])
    actor = states.LAUNCHER if status == states.QUEUED else states.IMPORTER
    return store, store.create_run(cfg, actor=actor, status=status, log_path=str(tmp / f"{status}.log"))


def _values(step: int) -> dict[str, float]:
    return {"train_loss": 3.0 + 1 / step, "lr": 1e-3, "grad_norm": 0.5, "tokens_per_s": 1e5, "peak_memory_bytes": 1e9}


def _ingest_ours(tmp: Path, steps: int, url: str | None = None) -> float:
    """Seconds from the writer's hand-over of ``steps`` x 5 values until the database (a new SQLite file in
    ``tmp``, or the server at ``url``) holds them."""
    store, run_id = _new_run(url or f"sqlite:///{tmp}/ingest.db", tmp)
    writer = store.writer(store.run(run_id), interval=3600.0)
    for step in range(1, steps + 1):  # handed over; written only at the flush
        writer.add(step, **_values(step))
        writer.progress(step)
    t0 = time.perf_counter()
    if not writer.flush(timeout=600):
        raise AttnresError("bench tracker: the writer could not write its rows")
    seconds = time.perf_counter() - t0
    writer.close()
    if url is None:
        store.close()
    return seconds


def _ingest_raw(tmp: Path, steps: int) -> float:
    """Seconds for raw sqlite3 ``executemany`` of the same rows into the same schema (one commit)."""
    store, run_id = _new_run(f"sqlite:///{tmp}/raw.db", tmp)
    store.close()
    payload = [(run_id, k, step, 3.0 + 1 / step) for step in range(1, steps + 1) for k in range(1, len(KEYS) + 1)]
    return raw_sqlite_insert_s(tmp / "raw.db", KEYS, payload)


def bench_ingest(tmp: Path, steps: int, repeat: int = 5) -> dict[str, float]:
    """Rows/s from the writer's hand-over until the database holds them, beside raw sqlite3's executemany:
    the best of ``repeat`` alternating tries each, each on fresh files (a shared machine's noise is one-sided)."""
    ours = raw = float("inf")
    for attempt in range(repeat):
        folder = tmp / f"ingest-{attempt}"
        folder.mkdir()
        ours = min(ours, _ingest_ours(folder, steps))
        raw = min(raw, _ingest_raw(folder, steps))
    n = steps * len(KEYS)
    return {"ingest_rows": n, "ingest_rows_per_s": n / ours, "raw_sqlite_rows_per_s": n / raw,
            "ingest_vs_raw": raw / ours}


def bench_log_calls(tmp: Path, steps: int) -> dict[str, float]:
    """What a logged step costs the training thread: the trainer's recorder (``record`` of 5 values and
    ``progress``), with its writer and heartbeat threads running as in training; p50 and p99."""
    from attnres.tracking import states
    from attnres.training.loop import Ending
    from attnres.training.recorder import RunRecorder

    store, run_id = _new_run(f"sqlite:///{tmp}/calls.db", tmp, status=states.QUEUED)
    recorder = RunRecorder(store, run_id)
    calls = []
    clock = time.perf_counter_ns
    for step in range(1, steps + 1):
        values = _values(step)
        t0 = clock()
        recorder.record(step, **values)
        recorder.progress(step)
        calls.append(clock() - t0)
    recorder.finish(Ending(states.FINISHED, steps))
    store.close()
    calls.sort()
    return {"log_calls": steps, "log_call_p50_us": statistics.median(calls) / 1e3,
            "log_call_p99_us": calls[min(len(calls) - 1, int(0.99 * len(calls)))] / 1e3}


def bench_report_time(tmp: Path, runs: int, steps: int, write_report: ReportWriter,
                      repeat: int = 2) -> dict[str, float]:
    """Seconds for the whole document over a synthetic database (without, then with figures; best of
    ``repeat``)."""
    from attnres.bench.synthetic import synthetic_db

    url = f"sqlite:///{tmp}/report.db"
    n = synthetic_db(url, runs, steps)
    store = RunStore(url)

    def timed(plots: bool) -> float:
        t0 = time.perf_counter()
        write_report(store, tmp / "report.md", plots=plots)
        return time.perf_counter() - t0

    plain = min(timed(False) for _ in range(repeat))  # the best: the first also imports scipy and warms caches
    plots = min(timed(True) for _ in range(repeat))
    store.close()
    return {"report_rows": n, "report_s": plain, "report_with_plots_s": plots}


def _attnres_exe() -> list[str]:
    exe = Path(sys.executable).with_name("attnres")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("attnres")
    return [found] if found else [sys.executable, "-c", "from attnres.cli.main import main; main()"]


def _wall(cmd: list[str], repeat: int = 3, env: dict[str, str] | None = None) -> float:
    """Best of ``repeat`` whole-process wall times (the first run also warms the file cache)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        best = min(best, time.perf_counter() - t0)
        if done.returncode != 0:
            raise AttnresError(f"bench tracker: {' '.join(cmd[-3:])} failed: {done.stderr.strip()[-300:]}")
    return best


def bench_status(tmp: Path, runs: int, steps: int, repeat: int = 3) -> dict[str, float]:
    """Whole-process seconds of ``attnres status`` over ``runs`` runs, beside ``attnres --help`` (best of
    ``repeat``)."""
    from attnres.bench.synthetic import synthetic_db

    path = tmp / "status.db"
    n = synthetic_db(f"sqlite:///{path}", runs, steps)
    exe = _attnres_exe()
    return {"status_runs": runs, "status_rows": n, "status_s": _wall([*exe, "status", "--db", str(path)], repeat),
            "status_all_s": _wall([*exe, "status", "--all", "--db", str(path)], repeat=1),
            "help_s": _wall([*exe, "--help"], repeat)}


def bench_paper(tmp: Path, write_report: ReportWriter, url: str | None = None, tag: str = "paper",
                progress: Callable[[str], None] = lambda _: None, repeat: int | None = None,
                steps: int = 6000) -> dict[str, float]:
    """The report (without, then with figures) and ``attnres status`` (whole processes) over the results
    document's study at paper scale, in a new SQLite file in ``tmp`` or the database at ``url``."""
    from attnres.bench.paper import paper_db

    url = url or f"sqlite:///{tmp}/paper.db"
    out: dict[str, float] = {f"{tag}_{k.removeprefix('paper_')}": v
                             for k, v in paper_db(url, steps=steps, progress=progress).items()}
    progress(f"{tag}: report and status")
    store = RunStore(url)

    def timed(plots: bool) -> float:
        t0 = time.perf_counter()
        write_report(store, tmp / f"{tag}.md", plots=plots)
        return time.perf_counter() - t0

    out[f"{tag}_report_s"] = min(timed(False) for _ in range(repeat or 2))
    out[f"{tag}_report_with_plots_s"] = min(timed(True) for _ in range(repeat or 2))
    store.close()
    exe, env = _attnres_exe(), os.environ | {"ATTNRES_DB": url}  # (a server's password stays off command lines)
    out[f"{tag}_status_s"] = _wall([*exe, "status"], repeat or 3, env)
    out[f"{tag}_status_all_s"] = _wall([*exe, "status", "--all"], repeat or 3, env)
    return out


def bench_tracker(write_report: ReportWriter, rows: int = 100_000, report_runs: int = 40, report_steps: int = 3000,
                  status_runs: int = 1000, status_steps: int = 100, server: str | None = None,
                  progress: Callable[[str], None] = lambda _: None, repeat: int | None = None,
                  grow: int = 10, paper: bool = True, paper_steps: int = 6000) -> dict[str, float]:
    """Every measure of the module docstring, in one run; with ``server`` (a PostgreSQL URL) also the writer's
    ingest into that server (a run is added there). The report and status are measured again at ``grow`` times
    the runs (``report_x10_s``, ...), and each growth is printed as the ratio of the times (``report_growth``: 10
    for a cost linear in the rows), so that a cost that grows faster than the data shows (1: one size only).
    With ``paper``, the report and status over the study at paper scale (``paper_*``; with ``server`` also in a
    scratch database on that server, ``paper_pg_*``).

    Each measure keeps the best of several tries (ingest 5, report 2, processes 3), as a shared
    machine's noise only ever adds time; ``repeat`` sets one count for all (1: a quick look).
    """
    if min(rows, report_runs, report_steps, status_runs, status_steps, repeat or 1, grow) < 1:
        raise AttnresError("bench tracker: --rows, --runs, --steps, --status-runs, --repeat and --grow must be at "
                           "least 1")
    if server:
        check_server(server)
    if paper_steps < 250:
        raise AttnresError("bench tracker: --paper-steps must be at least 250 (an eval every 250 steps)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        progress(f"ingest: {rows:,} rows through the writer, then raw sqlite3")
        steps = max(1, rows // len(KEYS))  # logged steps of 5 values
        tries = {} if repeat is None else {"repeat": repeat}  # each measure's own default otherwise
        out = bench_ingest(tmp, steps, **tries) | bench_log_calls(tmp, steps)
        if server:
            progress(f"ingest: {rows:,} rows through the writer into {server.split('@')[-1]}")
            best = min(_ingest_ours(tmp, steps, server) for _ in range(repeat or 3))
            out["server_ingest_rows_per_s"] = steps * len(KEYS) / best
        progress(f"report: {report_runs} runs x {report_steps:,} steps")
        out |= bench_report_time(tmp, report_runs, report_steps, write_report, **tries)
        progress(f"status: {status_runs:,} runs")
        out |= bench_status(tmp, status_runs, status_steps, **tries)
        if grow > 1:
            out |= _grown(tmp, out, grow, report_runs, report_steps, status_runs, status_steps, write_report,
                          progress, tries)
        if paper:
            out |= bench_paper(tmp, write_report, progress=progress, repeat=repeat, steps=paper_steps)
            if server:
                with scratch_database(server) as url:
                    out |= bench_paper(tmp, write_report, url, "paper_pg", progress, repeat, paper_steps)
    return out


def _grown(tmp: Path, base: dict[str, float], grow: int, report_runs: int, report_steps: int, status_runs: int,
           status_steps: int, write_report: ReportWriter, progress: Callable[[str], None],
           tries: dict[str, int]) -> dict[str, float]:
    """The report and status at ``grow`` times the runs, and each time's ratio to the base size's."""
    folder = tmp / f"x{grow}"
    folder.mkdir()
    progress(f"report: {report_runs * grow} runs x {report_steps:,} steps ({grow}x)")
    report = bench_report_time(folder, report_runs * grow, report_steps, write_report, **tries)
    progress(f"status: {status_runs * grow:,} runs ({grow}x)")
    status = bench_status(folder, status_runs * grow, status_steps, **tries)
    tag = f"x{grow}"
    out: dict[str, float] = {f"report_{tag}_rows": report["report_rows"], f"status_{tag}_runs": status["status_runs"]}
    for stem, seconds in (("report", report["report_s"]), ("report_with_plots", report["report_with_plots_s"]),
                          ("status", status["status_s"]), ("status_all", status["status_all_s"])):
        out[f"{stem}_{tag}_s"] = seconds
        out[f"{stem}_growth"] = seconds / base[f"{stem}_s"]
    return out
