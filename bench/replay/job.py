"""A replay run: the traced steps' collectives replayed on every rank for each implementation,
priced on the links asked, written as a run folder (``columns.REPLAY``) and reported."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from bench.analysis.collective_calls import busbw_gbps
from bench.analysis.sequence import JobSequence
from bench.replay import play, price
from bench.runfolder import columns
from bench.runfolder.folder import ResultsWriter, default_run_dir, git_commit, utc_now, write_meta
from bench.runfolder.schema import SCHEMA_VERSION, read_results
from bench.runner.faults import launcher
from bench.runner.session.distenv import DistEnv

REPO = Path(__file__).resolve().parents[2]


def step_calls(seq: JobSequence) -> dict[int, pd.DataFrame]:
    """Per step, the calls to replay (the lowest traced rank's: the ranks agree, or only some
    were traced and the others are assumed to issue the same), with the traced time across the
    ranks traced: the shortest (transfer) and the longest."""
    calls = seq.calls
    first = calls[calls["rank"] == calls["rank"].min()]
    times = calls.groupby(["step", "index"])["traced_us"].agg(["min", "max"])
    out = {}
    for step, rows in first.groupby("step", sort=True):
        rows = rows.sort_values("index").reset_index(drop=True)
        at = times.loc[[(step, i) for i in rows["index"]]]
        out[int(step)] = rows.assign(
            traced_us=at["min"].to_numpy(), traced_us_max=at["max"].to_numpy()
        )
    return out


def base_row(c: dict, step: int, env_backend: str, device: str) -> dict:
    n = int(c["group_size"])
    known = not pd.isna(c["count"])
    size = play.registry_count(c["op"], c["nbytes"], n)  # S: the trace's bytes, all-gather's x n
    return {
        "sweep": "replay",
        "kind": "call",
        "step": step,
        "index": int(c["index"]),
        "op": c["op"],
        "dtype": c["dtype"],
        "count": int(c["count"]) if known else np.nan,
        "size_bytes": size,
        "group": str(c["group"]),
        "group_size": n,
        "group_ranks": " ".join(map(str, c["group_ranks"])),
        "traced_us": c["traced_us"],
        "traced_us_max": c["traced_us_max"],
        "traced_busbw_GBps": busbw_gbps(c["op"], size, n, c["traced_us"]),
        "backend": env_backend,
        "device": device,
    }


def total_row(rows: list[dict], head: dict) -> dict:
    """The step's totals of ``rows`` (the calls of one step and one source)."""
    ok = [r for r in rows if r.get("status") == "ok"]
    return {
        **{k: head[k] for k in ("sweep", "source", "impl", "link", "step", "backend", "device")},
        "kind": "step",
        "op": "step total",
        "status": "ok" if ok else "error",
        "error": "" if ok else "no call of the step was costed",
        "traced_us": float(np.nansum([r["traced_us"] for r in rows])),
        "time_us": float(np.nansum([r["time_us"] for r in ok])) if ok else np.nan,
        "count": len(ok),
        "wrong": sum(int(r.get("wrong") or 0) for r in ok),
        "point": f"{head['point'].rsplit('-', 1)[0]}-total",
    }


def priced_rows(
    steps: dict[int, pd.DataFrame], costs: list[tuple[str, object]], backend: str, device: str
) -> list[dict]:
    out = []
    for label, model in costs:
        for step, calls in steps.items():
            rows = []
            for c in calls.to_dict("records"):
                row = base_row(c, step, backend, device)
                t, why = price.priced_us(model, c["op"], row["size_bytes"], row["group_size"])
                row.update(
                    source="priced",
                    impl="",
                    link=label,
                    time_us=t,
                    busbw_GBps=busbw_gbps(c["op"], row["size_bytes"], row["group_size"], t),
                    status="unsupported" if why else "ok",
                    error=why,
                    point=f"priced-{label}-s{step}-{row['index']}",
                )
                rows.append(row)
            out += [*rows, total_row(rows, rows[0])] if rows else []
    return out


def replayed_rows(
    steps: dict[int, pd.DataFrame],
    impl: str,
    groups: play.Groups,
    env: DistEnv,
    args: argparse.Namespace,
    write,
) -> None:
    """Replay every step with ``impl``; rank 0 writes each step's rows as they are made."""
    for step, calls in steps.items():
        records = calls.to_dict("records")
        outcome, durations = play.replay(
            records, impl, groups, env, warmup=args.warmup, reps=args.reps
        )
        table, errors = play.gather_times(outcome, durations)
        rows = []
        for c, (_, t), err in zip(records, table.iterrows(), errors, strict=True):
            row = base_row(c, step, env.backend, env.device.type)
            unsupported = err.startswith("not replayed")
            row.update(
                source="replayed",
                impl=impl,
                link="",
                reps=args.reps,
                status="unsupported" if unsupported else "error" if err else "ok",
                error=err,
                point=f"{impl}-s{step}-{row['index']}",
            )
            if not err:
                row.update(
                    time_us=t["time_us"],
                    time_us_max=t["time_us_max"],
                    wrong=int(t["wrong"]),
                    busbw_GBps=busbw_gbps(
                        c["op"], row["size_bytes"], row["group_size"], t["time_us"]
                    ),
                )
            rows.append(row)
        for row in [*rows, total_row(rows, rows[0])]:
            write(row)


def meta_of(
    args, argv, seq: JobSequence, env_backend: str, device: str, run_dir: Path, world: int
) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "replay",
        "tradeoff": False,
        "run_id": run_dir.name,
        "sweep": "replay",
        "argv": argv,
        "trace_dir": str(args.trace_dir),
        "traced_world_size": seq.world_size,
        "traced_ranks": list(seq.ranks),
        "assumed_spmd": seq.assumed_spmd,
        "steps": list(seq.steps),
        "notes": list(seq.notes),
        "world_size": world,
        "backend": env_backend,
        "device": device,
        "torch_version": torch.__version__,
        "git_commit": git_commit(REPO),
        "start_time": utc_now(),
        "end_time": None,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }


class Writer:
    """Rank 0's run folder: meta.json and results.csv, each row appended as it is made."""

    def __init__(self, run_dir: Path, meta: dict):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir, self.meta = run_dir, meta
        write_meta(run_dir / "meta.json", meta)
        self.results = ResultsWriter(run_dir / "results.csv", columns.written(columns.REPLAY))

    def __call__(self, row: dict) -> None:
        self.results.append(row)

    def close(self) -> None:
        self.meta["end_time"] = utc_now()
        write_meta(self.run_dir / "meta.json", self.meta)


def run_dir_of(args) -> Path:
    return args.out if args.out is not None else default_run_dir(Path("results"), "replay")


def summary(run_dir: Path) -> str:
    """The console's lines: each step's communication, traced and as each source costs it."""
    df = read_results(run_dir)
    steps = df[df["kind"] == "step"]
    lines = []
    for r in steps.itertuples():
        how = r.impl if isinstance(r.impl, str) and r.impl else r.link
        lines.append(
            f"step {r.step}: traced {r.traced_us / 1e3:.2f} ms, {r.source} ({how}) "
            f"{r.time_us / 1e3:.2f} ms over {r.count} calls"
            + (f", {r.wrong} wrong" if r.wrong else "")
        )
    bad = df[(df["kind"] == "call") & (df["status"] != "ok")].drop_duplicates("error")
    lines += [
        f"  call {int(r.index)} of step {r.step} ({r.op}): {r.status}: {r.error}"
        for r in bad.itertuples()
    ]
    return "\n".join(lines)


def finish(writer: Writer, args) -> None:
    writer.close()
    print(summary(writer.run_dir), flush=True)
    report = ""
    if not args.no_report:
        from bench.report.page import write_report

        try:
            path, _ = write_report(writer.run_dir, args.reports_dir)
            report = f"  report: {path}"
        except Exception as e:  # noqa: BLE001  (the results are safe: say why there is none)
            print(f"report not written: {type(e).__name__}: {e}", file=sys.stderr)
    print(f"results: {writer.run_dir}{report}", flush=True)


def rank_lists(steps: dict[int, pd.DataFrame]) -> list[tuple[int, ...]]:
    return [tuple(r) for calls in steps.values() for r in calls["group_ranks"]]


def replay_everywhere(args, argv, seq: JobSequence, costs, env: DistEnv) -> int:
    """The command's ranks: the replay, then they leave (the launcher's watch stopped once the
    collectives are done: the ranks leave one by one, and one gone first is no lost launcher)."""
    replay_on(args, argv, seq, costs, env, done=launcher.stop)
    dist.destroy_process_group()
    return 0


def replay_on(args, argv, seq: JobSequence, costs, env: DistEnv, done=lambda: None) -> None:
    """Every rank of a started job (the command's, or ranks a test already holds): groups, the
    replay of each implementation, the groups released; rank 0 writes and reports. ``done``:
    called when this rank's last collective of the replay is over."""
    steps = step_calls(seq)
    writer = None
    if env.is_main:
        writer = Writer(
            run_dir_of(args),
            meta_of(
                args, argv, seq, env.backend, env.device.type, run_dir_of(args), env.world_size
            ),
        )
    groups = play.Groups(rank_lists(steps), args.point_timeout)
    for impl in args.impls:
        replayed_rows(steps, impl, groups, env, args, writer or (lambda _row: None))
    groups.release()
    done()
    if writer is not None:
        for row in priced_rows(steps, costs, env.backend, env.device.type):
            writer(row)
        finish(writer, args)


def price_only(args, argv, seq: JobSequence, costs) -> int:
    """No implementation asked (``--impl none``): price the steps here, without ranks."""
    steps = step_calls(seq)
    run_dir = run_dir_of(args)
    writer = Writer(run_dir, meta_of(args, argv, seq, "", "", run_dir, 0))
    for row in priced_rows(steps, costs, "", ""):
        writer(row)
    finish(writer, args)
    return 0
