"""The answers a training run gives, in words, each with its confidence (HTML fragments).

The statistics are the analysis layer's (``bench.analysis.confidence``); this module only says
them: per model and implementation, the best value and every value tied with it, the default's
cost over the best as a ratio with its interval, and a warning where the machine's noise floor
is larger than the differences the sweep tries to resolve.
"""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd

from bench.analysis.confidence import families, noise_floor_pct, rounds_disagree


def fmt_value(v) -> str:
    """A knob's value as the report writes it (here, not beside the figures: the console's
    summary says it too, and a rank need not import matplotlib to say it)."""
    return f"{v:g}" if isinstance(v, int | float | np.number) else str(v)


def _values(vals: list) -> str:
    return ", ".join(fmt_value(v) for v in vals)


def _interval(r: pd.Series, prefix: str) -> str:
    lo, hi = r[f"{prefix}_low"], r[f"{prefix}_high"]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "no interval (too few rounds or samples)"
    return f"[{lo:.2f}, {hi:.2f}]"


def verdict_line(v: pd.Series, knob: str, second: str | None, confidence: str) -> str:
    """One group's answer (text; the caller escapes it)."""
    where = f", {second}={fmt_value(v['value2'])}" if second else ""
    head = f"{v['model']}, {v['impl']}{where}: "
    tied = list(v["tied"])
    if v["n_values"] == 1:
        return head + f"one value, {knob}={fmt_value(v['best'])}, at {v['best_ms']:.1f} ms"
    if len(tied) == v["n_values"]:
        text = (
            f"tie: no value of {knob} is separable from the fastest at {confidence} "
            f"({_values(tied)}; the fastest, {knob}={fmt_value(v['best'])}, at "
            f"{v['best_ms']:.1f} ms, the slowest {v['span_pct']:.1f} % behind)"
        )
    else:
        text = f"best {knob}={fmt_value(v['best'])} at {v['best_ms']:.1f} ms"
        others = [t for t in tied if t != v["best"]]
        text += (
            f", tied with {_values(others)} (not separable at {confidence})"
            if others
            else f", separable from every other value at {confidence}"
        )
    if v["default"] is None or (isinstance(v["default"], float) and math.isnan(v["default"])):
        return head + text
    d = fmt_value(v["default"])
    if v["default_is_best"]:
        text += f"; the default {d} is the fastest"
    else:
        text += (
            f"; the default {d} takes x{v['default_ratio']:.3f} {_interval(v, 'default')} "
            f"the time of the best: {'tied' if v['default_tied'] else 'slower'}"
        )
    return head + text


def headline(verdicts: pd.DataFrame, knob: str, second: str | None, rounds: int) -> str:
    """Every group's answer, and the noise warning where it applies (HTML)."""
    if verdicts.empty:
        return "no point finished"
    confidence = "95 %" + (" with rounds' drift" if rounds > 1 else "")
    lines = []
    for _, v in verdicts.iterrows():
        paired = v.get("method") == "paired"
        level = f"95 %, paired over {int(v['cycles'])} cycles" if paired else confidence
        line = html.escape(verdict_line(v, knob, second, level))
        if v["within_floor"]:
            line += (
                f" <span class='flag'>(every difference here, {v['span_pct']:.1f} % at most, is "
                f"smaller than the machine's noise floor of {v['floor_pct']:.1f} %)</span>"
            )
        lines.append(line)
    return "<br>".join(lines)


def _interleaved(results: pd.DataFrame) -> list[str]:
    """What the interleaved points were, how their cycles ended and what interleaving cost."""
    if "method" not in results:
        return []
    paired = results[(results["method"] == "paired") & (results["status"] == "ok")]
    if paired.empty:
        return []
    stops = ", ".join(f"{k} {v}" for k, v in paired["stop"].value_counts().items())
    cost = paired["interleave_cost_pct"].dropna()
    spread = (
        f"median {cost.median():+.1f} %, from {cost.min():+.1f} to {cost.max():+.1f} %"
        if len(cost)
        else "not measured"
    )
    return [
        f"<p>{len(paired)} point(s) were interleaved: each model's candidates built together "
        "and timed in cycles, one step of each per cycle in a fresh random order, "
        f"{int(paired['cycles'].max())} cycles at most, from {int(paired['cycles'].min())} "
        f"(stopped: {stops}; decided: its comparison with the best excludes 1 or lies within "
        "the tie band, and it left the cycles; after half the budget only the best and the "
        "default go on, the others' share spent). Their verdicts come from the per-cycle "
        "ratios of each candidate to the best over the cycles they share: the Hodges-Lehmann "
        "estimate with the signed-rank test's distribution-free interval, so that drift and "
        "load that fall on a whole cycle cancel. What interleaving changed in a point's step "
        f"(interleaved over alone): {spread}.</p>"
    ]


def confidence_section(
    meta: dict, results: pd.DataFrame, samples: pd.DataFrame, noise: pd.DataFrame
) -> list[str]:
    """How sure the run is: rounds, stops, the noise floor, and rounds that disagree."""
    cfg = meta.get("config", {})
    rounds = int(results["rounds"].max()) if "rounds" in results and len(results) else 1
    stops = results["stop"].value_counts().to_dict() if "stop" in results else {}
    floor = noise_floor_pct(noise)
    parts = [
        "<h2>Confidence</h2>",
        "<p>Each claim above is a 95 % interval. A point's typical step time is the geometric "
        "mean of its rounds' medians; with several rounds its interval comes from how much "
        "the rounds of the same model's points differ once whole rounds running slower are "
        "set aside (a randomised block design), with one round from its steps' order "
        "statistics plus the noise floor. Tied values cannot be separated from the best at "
        "95 % over the group's comparisons together (Bonferroni).</p>",
        f"<p>{rounds} round(s), each in a new random order; timing stopped at the target "
        f"(+-{cfg.get('target_ci_pct', '?')} %, or interleaved: decided) for "
        f"{stops.get('target', 0) + stops.get('decided', 0)} point(s), at the budget for "
        f"{sum(v for k, v in stops.items() if k not in ('target', 'decided'))} "
        f"(--max-steps {cfg.get('max_steps', '?')}, --max-point-s "
        f"{cfg.get('max_point_s', '?')}).</p>",
    ]
    parts += _interleaved(results)
    if math.isfinite(floor):
        parts.append(
            f"<p>Noise floor: a fixed reference workload timed between points ({len(noise)} "
            f"times) varied by {floor:.1f} % (standard deviation of its median): the machine's "
            "own wander, whatever the sweep changes.</p>"
        )
    dis = rounds_disagree(samples, families(results))
    bad = dis[dis["disagree"]] if len(dis) else dis
    if len(bad):
        items = "".join(
            f"<li><code>{html.escape(str(r.point))}</code>: rounds {r.round_spread_pct:.1f} % "
            f"apart (F test against the same model's other points, p = {r.p:.2g})</li>"
            for r in bad.itertuples()
        )
        parts.append(
            "<p class='flag'>Rounds that disagree: these points' rounds differ more than the same "
            "model's other points' rounds do (a visit disturbed by something else on the "
            "machine, often); each keeps its own spread, so its interval is wider, and the "
            f"others' is not widened by it.</p><ul>{items}</ul>"
        )
    elif len(dis):
        parts.append(
            f"<p>No point's rounds disagree (largest spread between rounds "
            f"{dis['round_spread_pct'].max():.1f} %).</p>"
        )
    return parts
