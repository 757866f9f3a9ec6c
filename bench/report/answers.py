"""A training sweep's answers, from the run folder: each point's typical time and interval, the
verdict per model and implementation, the headline in words, and the table the console prints
when the sweep ends (its columns the column table's ``console`` places). The HTML page and the
console read them alike."""

from __future__ import annotations

import html
import re
import sys

import numpy as np
import pandas as pd

from bench.analysis.confidence import families, point_intervals, run_estimates, verdicts
from bench.analysis.scaling import scaling_efficiency
from bench.report import claims
from bench.report.mfu import mfu_note
from bench.runfolder import columns
from bench.runfolder.points import PointRecord
from bench.runfolder.schema import Run
from bench.runfolder.verdicts import TIED_SEP, VERDICTS_COLUMNS, write_verdicts
from bench.stats.estimates import ratio


def swept_axes(points: dict[str, PointRecord]) -> tuple[dict, str | None]:
    """(swept axis -> its knob's default, the grid's second axis or None), from the record."""
    first = next(iter(points.values()), None)
    if first is None:
        return {}, None
    return first.swept_defaults, first.swept[1] if len(first.swept) > 1 else None


def training_claims(run: Run) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(results with each point's typical time and interval, the verdict per group)."""
    df = run.results
    ok = df[df["status"] == "ok"] if len(df) else df
    samples = run.samples[run.samples["point"].isin(ok["point"])] if len(ok) else run.samples
    est = run_estimates(samples, run.noise, families(ok))  # once, for the table and the claims
    intervals = point_intervals(est)
    if len(df) and len(intervals):
        df = df.merge(intervals.drop(columns="rounds"), on="point", how="left")
    defaults, _ = swept_axes(run.points)
    sweep = run.meta.get("sweep", "?").split(",")[0]
    found = verdicts(df, run.samples, run.noise, {"value": defaults.get(sweep)}, est)
    return df, found


def headline(run: Run, df: pd.DataFrame, found: pd.DataFrame) -> str:
    ok = df[df["status"] == "ok"]
    if "efficiency_pct" in ok and ok["efficiency_pct"].notna().any():
        return _scaling_headline(ok, run_estimates(run.samples, run.noise, families(ok)))
    _, second = swept_axes(run.points)
    rounds = int(df["rounds"].max()) if "rounds" in df and df["rounds"].notna().any() else 1
    return claims.headline(found, run.meta.get("sweep", "?").split(",")[0], second, rounds)


def headline_text(run: Run, df: pd.DataFrame, found: pd.DataFrame) -> str:
    """The headline as console text: a line per group."""
    text = headline(run, df, found).replace("<br>", "\n")
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def _scaling_headline(ok: pd.DataFrame, est: dict) -> str:
    """Per model, implementation and scaling mode: throughput and efficiency at the largest
    world size, against the smallest, the efficiency with its 95 % interval (efficiency is
    proportional to the smallest size's step time over the largest's: their ratio's)."""
    lines = []
    for (model, impl, scaling), g in ok.groupby(["model", "impl", "scaling"], sort=False):
        top, base = g.loc[g["world_size"].idxmax()], g.loc[g["world_size"].idxmin()]
        span = ""
        if top["point"] in est and base["point"] in est and top["point"] != base["point"]:
            r = ratio(est[base["point"]], est[top["point"]])
            if pd.notna(r.low) and pd.notna(r.high):
                eff = top["efficiency_pct"]
                span = f" [{eff * r.low / r.ratio:.0f}, {eff * r.high / r.ratio:.0f}]"
        lines.append(
            f"<b>{html.escape(str(model))}</b>, {html.escape(str(impl))}, {scaling} scaling: "
            f"<b>{top['efficiency_pct']:.0f} % efficiency</b>{span} at {top['world_size']:g} ranks "
            f"({top['samples_per_s']:.0f} samples/s; {base['samples_per_s']:.0f} at "
            f"{base['world_size']:g}, ideal {base['samples_per_s'] * top['ideal_speedup']:.0f})"
        )
    return "<br>".join(lines)


def best_and_tied(ok: pd.DataFrame, found: pd.DataFrame) -> tuple[set, set]:
    """Row labels of each group's best point, and of the points tied with it."""
    best, tied = set(), set()
    for v in found.itertuples():
        sel = (ok["model"] == v.model) & (ok["impl"] == v.impl)
        if v.value2 is not None and "value2" in ok:
            sel &= ok["value2"] == v.value2
        for i, value in ok.loc[sel, "value"].items():
            if value == v.best:
                best.add(i)
            elif value in v.tied:
                tied.add(i)
    return best, tied


def verdict_table(found: pd.DataFrame) -> pd.DataFrame:
    """The verdicts as ``verdicts.csv`` holds them (``runfolder.verdicts``): values as text,
    the tied ones joined, and the method they came from."""

    def text(v) -> str:  # numbers as the point ids write them (25, 0.25), whatever the dtype
        if v is None or (isinstance(v, float) and pd.isna(v)):
            return ""
        if isinstance(v, int | float | np.number) and not isinstance(v, bool):
            return f"{float(v):g}"
        return str(v)

    rows = [
        {
            **{k: getattr(v, k) for k in VERDICTS_COLUMNS if hasattr(v, k)},
            "best": text(v.best),
            "default": text(v.default),
            "value2": text(v.value2),
            "tied": TIED_SEP.join(text(t) for t in v.tied),
        }
        for v in found.itertuples()
    ]
    return pd.DataFrame(rows, columns=VERDICTS_COLUMNS)


def close_training_run(run: Run) -> str:
    """At a training sweep's end: ``verdicts.csv`` written, and the console's closing text."""
    df, found = training_claims(run)
    try:
        write_verdicts(run.path, verdict_table(found))
    except OSError as e:  # the results are safe; say why the verdicts are not
        print(f"verdicts.csv not written: {e}", file=sys.stderr)
    return console_summary(run, df, found)


ANSWERS_TABLE = [
    "model",
    "impl",
    "value2",
    "best_old",
    "best_new",
    "answer",
    "cost_old",
    "cost_new",
]


def _cost(r: pd.Series, side: str) -> str:
    ratio, lo, hi = (r.get(f"default_{k}_{side}") for k in ("ratio", "low", "high"))
    if ratio is None or pd.isna(ratio):
        return ""
    span = f" [{lo:.2f}, {hi:.2f}]" if pd.notna(lo) and pd.notna(hi) else ""
    return f"x{ratio:.3f}{span}"


def answers_then_and_now(old: pd.DataFrame | None, new: pd.DataFrame | None):
    """Per model and implementation in both runs' ``verdicts.csv``: the best value then and now,
    whether the answer held (the same best, or one within the other's ties) or moved, and the
    default's cost in each. None where either run has no verdicts."""
    if old is None or new is None or old.empty or new.empty:
        return None
    keys = ["model", "impl", "value2"]
    both = old.fillna({"value2": ""}).merge(
        new.fillna({"value2": ""}), on=keys, suffixes=("_old", "_new")
    )
    if both.empty:
        return None

    def answer(r: pd.Series) -> str:
        if r["best_old"] == r["best_new"]:
            return "held"
        if r["best_new"] in r["tied_old"] or r["best_old"] in r["tied_new"]:
            return "held (tied)"
        return "moved"

    both["answer"] = both.apply(answer, axis=1)
    both["cost_old"] = both.apply(_cost, axis=1, side="old")
    both["cost_new"] = both.apply(_cost, axis=1, side="new")
    return both[ANSWERS_TABLE]


def console_summary(run: Run, df: pd.DataFrame, found: pd.DataFrame) -> str:
    """The points (the best per model and implementation starred, values tied with it marked
    =), then each group's answer with its confidence; ``df``, ``found``: ``training_claims``."""
    df = scaling_efficiency(df)
    best, tied = best_and_tied(df[df["status"] == "ok"], found)
    df["best"] = ["*" if i in best else "=" if i in tied else "" for i in df.index]
    df["comm_MB"] = df["comm_bytes_per_step"] / 1e6
    df = df.dropna(axis=1, how="all")  # e.g. scaling columns outside world-size sweeps
    df = df.drop(columns=columns.quiet_columns(columns.TRAINING, df))  # knobs at their defaults
    cols = [c for c in columns.console_columns(columns.TRAINING) if c in df]
    table = df[cols].to_string(index=False, float_format="{:.2f}".format)
    return (
        f"{table}\n(* best per model and implementation, = tied with it at 95 %; typical_ms: "
        f"geometric mean of the rounds' medians, with its 95 % interval{mfu_note(df)})\n\n"
        + headline_text(run, df, found)
    )
