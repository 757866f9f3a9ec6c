"""The outputs stage: plan.csv (every row, ranked), plan.json (what the plan assumed, its
planning time, and after a verification its summary) and plan.html, each written whole or not
at all, and the plan on the console; then, after a verification, verify.csv."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from bench.plan import table
from bench.plan.calibration import Target
from bench.plan.plan_page import write_page
from bench.plan.request import PlanRequest
from bench.runfolder.atomic import write_text, write_with


def plan_json(request: PlanRequest, target: Target, took_s: float, n: int) -> dict:
    """plan.json's fields: the request's scale, the target as calibrated, the planning time."""
    return {
        "model": request.model,
        "world_size": request.world_size,
        "gpus_per_node": request.gpus_per_node,
        "device": target.device.name,
        "device_source": target.device.source,
        "links": target.topology.about,
        "global_batch": request.global_batch,
        "rates": {p: _rate(r) for p, r in target.rates.items()},
        "allowance_gib": target.allowance_gib,
        "configurations": n,
        "planning_s": took_s,
    }


def _rate(rate) -> dict:
    """A precision's rate as plan.json holds it: its roofline (profile and factor) whole."""
    out = {k: v for k, v in vars(rate).items() if k != "pricing"}
    if rate.pricing is not None:
        out["roofline"] = rate.pricing.about()
    return out


def write_plan(rows: pd.DataFrame, meta: dict, request: PlanRequest, out: Path) -> None:
    """plan.csv, plan.json and plan.html into ``out``, and the table and recommendation on the
    console."""
    write_with(out / "plan.csv", lambda f: rows.to_csv(f, index=False))
    _write_json(out, meta)
    page = write_page(rows, meta, request.tie_pct, out / "plan.html")
    print(table.render(rows, request.top, request.tie_pct))
    took = f"in {meta['planning_s']:.1f} s"
    print(f"planned {meta['configurations']} configurations {took}; {out / 'plan.csv'}, {page}")


def write_verification(checked: pd.DataFrame, summary: dict, meta: dict, out: Path) -> None:
    """verify.csv, plan.json again with the verification's summary, and the comparison on
    the console."""
    write_with(out / "verify.csv", lambda f: checked.to_csv(f, index=False))
    _write_json(out, {**meta, "verify": summary})
    print(table.render_verify(checked, summary))


def _write_json(out: Path, meta: dict) -> None:
    write_text(out / "plan.json", json.dumps(meta, indent=2, default=str) + "\n")
