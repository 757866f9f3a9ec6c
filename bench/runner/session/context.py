"""What every sweep shares: start-up, the run folder, the writer, resume, and the closing lines."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from bench.runfolder import lock
from bench.runfolder.columns import NOISE_COLUMNS
from bench.runfolder.folder import (
    ResultsWriter,
    SamplesWriter,
    default_run_dir,
    done_visits,
    git_commit,
    has_results,
    utc_now,
    write_meta,
)
from bench.runfolder.points import POINTS_FILE, PointRecord, RunFolderError, write_points
from bench.runfolder.schema import SCHEMA_VERSION, Run, read_meta, read_run
from bench.runner.configure.config import RunConfig
from bench.runner.configure.sweeps import SWEEPS, sweep_names
from bench.runner.faults import launcher, watchdog
from bench.runner.session.distenv import DistEnv, fail, init_distributed
from bench.runner.session.scheduler import jobs_so_far, slurm_job

REPO = Path(__file__).resolve().parents[2]
FINISHED = "finished"  # meta.json's ``ended`` for a run that ran every point


@dataclass
class History:
    """What a point's earlier rounds measured (every member rank holds the same): the step
    times, the skew of each step (last end - first end), each round's median, and the last
    row (its trace figures are carried to rounds that do not profile again)."""

    times: list[float] = field(default_factory=list)
    skew: list[float] = field(default_factory=list)
    medians: list[float] = field(default_factory=list)
    row: dict | None = None

    def add(self, times: list[float], skew: list[float] | None) -> None:
        self.times += times
        self.skew += skew or []
        self.medians.append(float(np.median(times)))


@dataclass
class RunContext:
    config: RunConfig
    env: DistEnv
    run_dir: Path
    skip: set  # (point, round) of visits already done (--resume); collectives: point ids
    writer: ResultsWriter | None = None  # rank 0 only
    samples: SamplesWriter | None = None  # rank 0 only
    noise: ResultsWriter | None = None  # rank 0 only
    meta: dict = field(default_factory=dict)
    history: dict[str, History] = field(default_factory=dict)  # point -> its earlier rounds
    gaps_done: int = 0  # noise-floor gaps already timed (--resume): numbering goes on from here

    def write(self, row: dict) -> None:
        """Append the row, and its timed samples (``samples_ms``) to samples.csv."""
        samples = row.pop("samples_ms", None)
        if self.writer is not None:
            self.writer.append(row)
            if samples:
                self.samples.append_samples(row["point"], row.get("round", 1), samples)

    def write_noise(self, row: dict) -> None:
        if self.noise is not None:
            self.noise.append(row)


def resume_problem(run_dir: Path, config: RunConfig, world_size: int | None) -> str | None:
    """Why ``run_dir`` cannot be resumed with this configuration, or None: another value of
    a setting that makes the run (``RunConfig``'s ``same_run`` fields), or another world."""
    meta_path = run_dir / "meta.json"
    if not meta_path.exists():
        return f"--resume: {run_dir} is not a run folder (no meta.json)"
    if not has_results(run_dir):
        return f"--resume: {run_dir} holds no results.csv to continue"
    try:  # a run of another schema has other columns: appending to it would mix them
        meta = read_meta(run_dir)
    except RunFolderError as e:
        return f"--resume: {e}"
    if meta.get("schema_version") != SCHEMA_VERSION:  # another version's rows, other columns
        return (
            f"--resume: {run_dir} was written as run folder {meta.get('schema_version')}, "
            f"this version writes {SCHEMA_VERSION} (other columns): resume it with the version "
            "that wrote it, or start a new run"
        )
    then = meta.get("config", {})
    now = config.run_settings()
    diffs = [f"{k} {then.get(k)!r} (now {v!r})" for k, v in now.items() if then.get(k) != v]
    if world_size is not None and meta.get("world_size") not in (None, world_size):
        diffs.append(f"world size {meta['world_size']} (now {world_size})")
    if diffs:
        return (
            f"--resume: {run_dir} was made with other settings: {', '.join(diffs)}; "
            "resume with the same ones or start a new run"
        )
    return None


def _prepare_run_dir(config: RunConfig, world_size: int) -> tuple[Path | None, str | None]:
    """Rank 0 only: pick the folder and hold it for the run's life (``lock.py``), refuse to
    overwrite finished results, or to resume a run made with other settings."""
    c = config
    run_dir = c.out if c.out is not None else default_run_dir(Path("results"), c.sweep)
    try:
        (run_dir / "traces").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return None, f"cannot create {run_dir}: {e.strerror}"
    try:
        held = lock.hold(run_dir, list(c.argv))
    except RunFolderError as e:
        return None, str(e)
    problem = None
    if has_results(run_dir) and not c.resume:
        problem = (
            f"{run_dir} already holds results: pass --resume to continue it, or "
            f"choose another --out"
        )
    elif c.resume:
        problem = resume_problem(run_dir, c, world_size)
    if problem:
        held.finished()  # refused, not interrupted: nothing for the next run to take over
        return None, problem
    if held.stale:
        print(
            f"note: {run_dir} was held by a run that ended without finishing ({held.stale}); "
            "this run takes it over",
            file=sys.stderr,
            flush=True,
        )
    return run_dir, None


def _meta(config: RunConfig, env: DistEnv, run_dir: Path) -> dict:
    sweeps = [SWEEPS[n] for n in sweep_names(config.sweep)]
    job = slurm_job()
    return {
        "schema_version": SCHEMA_VERSION,
        # what the reading side needs to know of the sweep, so that it never reads the table
        "kind": sweeps[0].kind,
        "tradeoff": any(s.tradeoff for s in sweeps),
        "run_id": run_dir.name,
        "sweep": config.sweep,
        "argv": list(config.argv),
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "backend": env.backend,
        "device": env.device.type,
        "device_name": torch.cuda.get_device_name(env.device)
        if env.device.type == "cuda"
        else platform.processor() or platform.machine(),
        "world_size": env.world_size,
        "nodes": env.nnodes,
        "ranks_per_node": env.local_world_size,
        "host": env.host,
        # CPU cores the ranks of a node share (cost model: can communication overlap for free?)
        "cpu_count": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "git_commit": git_commit(REPO),
        "start_time": utc_now(),
        "end_time": None,
        "ended": None,
        "config": config.settings(),
        # the batch job this launch ran in (None outside SLURM), and every job that worked on
        # this folder (a resubmitted or requeued job continues it with --resume)
        "slurm": job,
        "slurm_jobs": jobs_so_far(_previous_meta(run_dir) if config.resume else None, job),
    }


def _previous_meta(run_dir: Path) -> dict | None:
    try:
        return read_meta(run_dir)
    except RunFolderError:
        return None


def start_run(
    config: RunConfig,
    columns: list[str],
    points: list[PointRecord] | None = None,
) -> RunContext:
    """Initialise the process group; rank 0 prepares the folder, records the points (all of
    them, before the first runs) and every rank learns the folder."""
    # The default group only carries start-up and per-point agreement: it must outwait any
    # point's own timeout, and ranks that sit out a world-size point wait on it for the whole
    # point.
    env = init_distributed(backend=config.backend, timeout_s=max(900.0, 3 * config.point_timeout))
    launcher.watch(env.rank)  # a rank whose launcher dies without a word leaves too
    decision: list = [None]
    if env.is_main:
        decision = [_prepare_run_dir(config, env.world_size)]
    dist.broadcast_object_list(decision, group_src=0)
    run_dir, error = decision[0]
    if error:
        dist.destroy_process_group()
        fail(error)
    ctx = RunContext(config=config, env=env, run_dir=run_dir, skip=set())
    watchdog.install()  # SIGINT and SIGTERM end the running point as an error row
    if env.is_main:
        ctx.meta = _meta(config, env, run_dir)
        write_meta(run_dir / "meta.json", ctx.meta)
        watchdog.on_exit(lambda why: record_end(ctx, why))
        if points is not None:
            write_points(run_dir / POINTS_FILE, points)
        ctx.writer = ResultsWriter(run_dir / "results.csv", columns)
        ctx.samples = SamplesWriter(run_dir / "samples.csv")
        ctx.noise = ResultsWriter(run_dir / "noise.csv", NOISE_COLUMNS)
        if config.resume:
            ctx.skip, ctx.history, ctx.gaps_done = _resumed(run_dir)
    shared = [(ctx.skip, ctx.history, ctx.gaps_done)]
    dist.broadcast_object_list(shared, group_src=0)
    ctx.skip, ctx.history, ctx.gaps_done = shared[0]
    return ctx


def _resumed(run_dir: Path) -> tuple[set, dict[str, History], int]:
    """What a resumed run has done: the visits to skip, each point's earlier rounds, how many
    gaps it timed."""
    run = read_run(run_dir)
    skip = done_visits(run.visits)
    history: dict[str, History] = {}
    ok = run.visits[run.visits["status"] == "ok"] if len(run.visits) else run.visits
    samples = run.samples
    for row in ok.to_dict("records"):
        h = history.setdefault(row["point"], History())
        mine = samples[(samples["point"] == row["point"]) & (samples["round"] == row["round"])]
        h.add(mine["ms"].tolist(), None)  # the ranks' gaps are not on disk: skew restarts
        h.row = {k: v for k, v in row.items() if not (isinstance(v, float) and np.isnan(v))}
    return skip, history, len(run.noise)


def record_end(ctx: RunContext, why: str) -> None:
    """meta.json's end: when, and how (``FINISHED``, or why the run stopped early)."""
    ctx.meta["end_time"] = utc_now()
    ctx.meta["ended"] = why
    write_meta(ctx.run_dir / "meta.json", ctx.meta)


def finish_run(ctx: RunContext, summary: Callable[[Run], str]) -> int:
    """Rank 0: close meta.json, print the summary (table and answers), write the report, name
    both last."""
    launcher.stop()  # the ranks now leave one by one: one gone first is no lost launcher
    watchdog.on_exit(None)
    if ctx.env.is_main:
        record_end(ctx, FINISHED)
        lock.held(ctx.run_dir).finished()
        run = read_run(ctx.run_dir)
        df = run.results
        print("\n" + summary(run), flush=True)
        # The report layer (matplotlib, the model) is imported here, on rank 0 once the sweep is
        # done: at module level it cost every rank 0.56 s of start-up for nothing.
        from bench.report.page import write_report
        from bench.report.tb_scalars import write_sweep_scalars

        try:
            write_sweep_scalars(ctx.run_dir, ctx.config.sweep, df)
        except Exception as e:  # noqa: BLE001  (scalars are a convenience: say why, go on)
            print(f"TensorBoard scalars not written: {type(e).__name__}: {e}", file=sys.stderr)
        report_path = None
        if not ctx.config.no_report:
            try:
                predict_with = list(ctx.config.predict_with or ()) or None
                report_path, _ = write_report(
                    ctx.run_dir, ctx.config.reports_dir, collectives=predict_with
                )
            except Exception as e:  # noqa: BLE001  (results are safe; say why there is no report)
                print(f"report not written: {type(e).__name__}: {e}", file=sys.stderr)
        tail = f"  report: {report_path}" if report_path else ""
        print(f"results: {ctx.run_dir}{tail}", flush=True)
    return 0
