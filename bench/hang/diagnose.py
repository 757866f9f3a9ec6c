"""From the ranks' calls and stacks, the one line that says why the job hung.

The method (torch's analyser matches calls group by group; this adds the rank that never
arrived, where it is instead, and one readable line):

1. Per process group, the ranks' calls are compared sequence number by sequence number (the
   number the recorder gives each collective in its group). The first number where they differ
   in op, shapes or dtypes is a disagreement. Where the ops agree but the source lines differ,
   and one rank's calls from there on are the others' shifted by one, that rank skipped a call
   (or issued an extra one): a collective behind ``if rank == 0`` looks like this when the
   sizes happen to agree.
2. Where the calls agree, the ranks whose last call in a group is the highest wait in it; the
   members behind never issued it. What those are doing instead comes from their stacks and
   their calls in other groups: raised an error, in their own code, waiting in another group
   (two ranks waiting on each other across two groups is a deadlock of issue order), gone.
3. The earliest of these (by the time each call was issued) is the cause; later ones follow from
   it. A rank that issues, at the point of the hang, the first call of another step while the
   others have left their loop ran more steps than they did: uneven data.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.hang import calls as c
from bench.hang.dumps import Dumps, load

SIG = ["op", "shapes", "dtypes"]
SIG_SITE = [*SIG, "site"]


@dataclass(frozen=True)
class Diagnosis:
    kind: str  # disagree, skipped, extra, uneven, raised, own_code, waits, cycle, gone, p2p, none
    line: str
    ranks: tuple[int, ...] = ()  # the ranks it blames
    group: str | None = None
    seq: int | None = None
    op: str | None = None
    where: str | None = None  # the source line it names (file:line)


def _ranks(rs) -> str:
    rs = sorted(rs)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def _group(d: Dumps, name: str) -> str:
    desc = d.groups.get(name, ("undefined", []))[0]
    label = "default" if desc == "default_pg" else desc if desc not in ("", "undefined") else name
    return f"group {label}"


def _call(d: Dumps, row) -> str:
    """``all_reduce #3 (group default, 1,000 float32)``; ``row`` a tuple of ``calls``' rows."""
    dtype = ",".join(sorted(set(row.dtypes))) or "elements"  # format 1.x dumps name none
    return f"{row.op} #{row.seq} ({_group(d, row.group)}, {row.numel:,} {dtype})"


def _shapes(row) -> str:
    return " ".join(str(list(s)) for s in row.shapes) or "[]"


def _sig(row, cols) -> tuple:
    return tuple(getattr(row, k) for k in cols)


def _from(t: pd.DataFrame, s: int, cols) -> list[tuple]:
    return [_sig(r, cols) for r in t[t.seq >= s].itertuples()]


def _shifted(behind: pd.DataFrame, ahead: pd.DataFrame, s: int, cols) -> bool:
    """``behind``'s calls from #s on are ``ahead``'s from #s+1 on (at least one compared)."""
    a, b = _from(behind, s, cols), _from(ahead, s + 1, cols)
    k = min(len(a), len(b))
    return k >= 1 and a[:k] == b[:k]


def _first_difference(per_rank: dict[int, pd.DataFrame], cols) -> int | None:
    lo = max(int(t.seq.min()) for t in per_rank.values())
    hi = min(int(t.seq.max()) for t in per_rank.values())
    rows = {r: t.set_index("seq") for r, t in per_rank.items()}
    for s in range(lo, hi + 1):
        sigs = {tuple(t.loc[s, k] for k in cols) for t in rows.values() if s in t.index}
        if len(sigs) > 1:
            return s
    return None


def _at(t: pd.DataFrame, s: int):
    hit = t[t.seq == s]
    return next(hit.itertuples()) if len(hit) else None


def _repeats(t: pd.DataFrame, s: int) -> bool:
    """The call #s repeats an earlier call of this rank (same op, shapes, line): a new step.
    Without the line (a dump without stacks) a repeat cannot be distinguished from a
    disagreement."""
    row = _at(t, s)
    if row is None or row.site == c.UNKNOWN_SITE:
        return False
    return any(_sig(r, SIG_SITE) == _sig(row, SIG_SITE) for r in t[t.seq < s].itertuples())


@dataclass(frozen=True)
class _Difference:
    """A group's first call number where the ranks' calls differ (in ``cols``): each rank's
    call there, the ranks whose call is not the majority's, and one rank whose call is."""

    group: str
    seq: int
    cols: list[str]
    calls: dict[int, object]  # rank -> its call #seq (a tuple of ``calls``' rows)
    deviating: list[int]
    reference: int

    @property
    def first(self):
        """The majority's call."""
        return self.calls[self.reference]


def _shift(d: Dumps, per_rank: dict[int, pd.DataFrame], diff: _Difference) -> Diagnosis | None:
    """The "skipped" or "extra" Diagnosis when the deviating ranks' calls from #s on are the
    others' shifted by one, else None."""
    name, s, cols, at = diff.group, diff.seq, diff.cols, diff.calls
    dev, ref, first = diff.deviating, diff.reference, diff.first
    if all(_shifted(per_rank[r], per_rank[ref], s, cols) for r in dev):
        return Diagnosis(
            "skipped",
            f"{_ranks(dev)} never issued {_call(d, first)} that "
            f"{_ranks(set(at) - set(dev))} issued at {first.site}: "
            f"{_ranks(dev)}'s calls from #{s} on are the others' from #{s + 1} on",
            tuple(dev),
            name,
            s,
            first.op,
            first.site,
        )
    if all(_shifted(per_rank[ref], per_rank[r], s, cols) for r in dev):
        extra = at[dev[0]]
        return Diagnosis(
            "extra",
            f"{_ranks(dev)} issued {_call(d, extra)} at {extra.site} that the others never "
            f"did: their calls from #{s} on are {_ranks(dev)}'s from #{s + 1} on",
            tuple(dev),
            name,
            s,
            extra.op,
            extra.site,
        )
    return None


def _disagree(d: Dumps, diff: _Difference) -> Diagnosis:
    """The "disagree" Diagnosis: each distinct call at #s, with the ranks that issued it."""
    name, s, at, first = diff.group, diff.seq, diff.calls, diff.first
    parts = [
        " ".join(
            filter(
                None,
                [
                    _ranks([r for r, v in at.items() if _sig(v, SIG) == sig]),
                    v.op,
                    _shapes(v),
                    ",".join(v.dtypes),
                    f"at {v.site}",
                ],
            )
        )
        for sig, v in {_sig(v, SIG): v for v in at.values()}.items()
    ]
    return Diagnosis(
        "disagree",
        f"ranks disagree at collective #{s} ({_group(d, name)}): " + "; ".join(parts),
        tuple(diff.deviating),
        name,
        s,
        first.op,
        first.site,
    )


def _disagreement(d: Dumps, name: str, per_rank: dict[int, pd.DataFrame]) -> tuple | None:
    """(0, time, Diagnosis) of the group's first disagreement, or None."""
    s_sig = _first_difference(per_rank, SIG)
    s_site = _first_difference(per_rank, SIG_SITE)
    for s, cols in ((s_site, SIG_SITE), (s_sig, SIG)):
        if s is None:
            continue
        at = {r: _at(t, s) for r, t in per_rank.items() if _at(t, s) is not None}
        counts = pd.Series([_sig(v, cols) for v in at.values()]).value_counts(sort=False)
        major = counts.idxmax()  # ties: the lowest rank's call
        dev = [r for r, v in at.items() if _sig(v, cols) != major]
        ref = next(r for r, v in at.items() if _sig(v, cols) == major)
        when = min(v.time_ns for v in at.values())
        diff = _Difference(name, s, cols, at, dev, ref)
        shift = _shift(d, per_rank, diff)
        if shift is not None:
            return 0, when, shift
        if cols is SIG_SITE:
            continue  # lines differ, calls agree, no shift: ranks may call from other lines
        longer = [r for r in at if r not in dev and _repeats(per_rank[r], s)]
        history = {
            _sig(x, SIG) for r in longer for x in per_rank[r][per_rank[r].seq < s].itertuples()
        }
        if longer and all(_sig(at[r], SIG) not in history for r in dev):
            return 0, when, _uneven(d, longer, dev, diff.first, [at[r] for r in dev])
        return 0, when, _disagree(d, diff)
    return None


def _uneven(d: Dumps, longer, shorter, call, elsewhere) -> Diagnosis:
    where = "; ".join(f"{_ranks([e.rank])} is at {e.op} #{e.seq} at {e.site}" for e in elsewhere)
    gone = [r for r in shorter if r not in {e.rank for e in elsewhere}]
    if gone:
        where = "; ".join(filter(None, [where, f"{_ranks(gone)} left no further call"]))
    return Diagnosis(
        "uneven",
        f"{_ranks(longer)} began another step ({_call(d, call)} at {call.site}, as in the step "
        f"before) that {_ranks(shorter)} never began ({where}): the ranks ran different numbers "
        f"of steps; uneven data? (DistributedSampler(drop_last=True), or DDP's Join context)",
        tuple(shorter),
        call.group,
        call.seq,
        call.op,
        call.site,
    )


def _whereabouts(d: Dumps, df: pd.DataFrame, rank: int, waits: dict[int, object]) -> tuple:
    """(kind, text) of what ``rank`` does instead of the call the others wait in."""
    dump = d.ranks.get(rank)
    if dump is None:
        return "gone", f"{_ranks([rank])} left no dump"
    stacks = dump.stacks
    if stacks and stacks.get("error") and not c.comm_failure(stacks["error"]):
        frame = c.own_frame(stacks.get("raised_at", [])) or c.own_frame(
            c.main_thread_frames(stacks)
        )
        text, error = c.code(frame), str(stacks["error"]).splitlines()[0][:200]
        return "raised", (
            f"{_ranks([rank])} raised {error} at {c.site(frame)}" + (f" ({text})" if text else "")
        )
    if rank in waits:
        w = waits[rank]
        return "elsewhere", f"{_ranks([rank])} waits in {_call(d, w)} at {w.site}"
    if stacks and not c.in_collective(stacks):
        frame = c.own_frame(c.main_thread_frames(stacks))
        text = c.code(frame)
        return "own_code", (
            f"{_ranks([rank])} is in its own code at {c.site(frame)}"
            + (f" ({text})" if text else "")
        )
    mine = df[df["rank"] == rank]
    if len(mine):  # a tuple, as every row here: a Series' .dtypes is its own, not the column
        last = next(mine.sort_values("time_ns").tail(1).itertuples())
        return "elsewhere", f"{_ranks([rank])}'s last call was {_call(d, last)} at {last.site}"
    return "elsewhere", f"{_ranks([rank])} issued no collective"


@dataclass(frozen=True)
class _Head:
    """A group's newest call (a tuple of ``calls``' rows), the ranks waiting in it, and the
    members behind, which never issued it."""

    group: str
    call: object
    waiting: list[int]
    behind: list[int]


def diagnose(d: Dumps) -> Diagnosis:
    """The cause of the hang the dumps show, in one line (kind "none" when nothing is wrong)."""
    df = c.calls(d)
    if df.empty:
        missing = f" (no dump from {_ranks(d.missing)})" if d.missing else ""
        return Diagnosis("none", f"no collective in the dumps: nothing to compare{missing}")
    found: list[tuple] = []
    heads: list[_Head] = []
    for name, sub in df.groupby("group", sort=False):
        per_rank = {int(r): t for r, t in sub.groupby("rank")}
        got = _disagreement(d, name, per_rank)
        if got:
            found.append(got)
            continue
        top = int(sub.seq.max())
        members = d.groups.get(name, ("", sorted(per_rank)))[1] or sorted(per_rank)
        waiting = [r for r, t in per_rank.items() if int(t.seq.max()) == top]
        behind = [r for r in members if r not in waiting]
        if behind:
            heads.append(_Head(name, _at(per_rank[waiting[0]], top), waiting, behind))
    # a rank's wait: its newest call that others have not joined
    waits: dict[int, object] = {}
    for head in heads:
        row = head.call
        for r in head.waiting:
            if r not in waits or row.record > waits[r].record:
                waits[r] = _at(df[(df.group == head.group) & (df["rank"] == r)], row.seq)
    for head in heads:
        # The wait that is the cause: the ranks behind it went on to a call that, in every
        # earlier step, came right after a call at this one's line (they skipped it).
        # Otherwise the first wait in time (ranks drift: a weak guide).
        skipped = bool(head.behind) and all(
            r in waits and _skipped(df, r, waits[r], head.call.site) for r in head.behind
        )
        first = 0 if skipped else 1
        found.append((first, head.call.time_ns, _explain(d, df, head, waits, skipped)))
    if not found:
        missing = f" (no dump from {_ranks(d.missing)})" if d.missing else ""
        return Diagnosis(
            "none",
            f"no hang in the dumps: every group's calls agree and no rank "
            f"waits for another{missing}",
        )
    *_, diag = min(found, key=lambda f: (*f[:-1], f[-1].kind != "disagree"))
    if d.missing and diag.kind != "gone":
        diag = Diagnosis(
            diag.kind,
            f"{diag.line} (no dump from {_ranks(d.missing)})",
            diag.ranks,
            diag.group,
            diag.seq,
            diag.op,
            diag.where,
        )
    return diag


def _skipped(df: pd.DataFrame, rank: int, row, site: str) -> bool:
    """Whether ``rank`` skipped a call at ``site`` before its call ``row``: every earlier call
    it made at ``row``'s line came right after one at ``site``, and this one did not."""
    if c.UNKNOWN_SITE in (site, row.site):  # no stacks: no line to detect a skip by
        return False
    sites = df[df["rank"] == rank].sort_values("record")
    sites = sites[sites.record <= row.record].site.tolist()
    before = [a for a, b in itertools.pairwise(sites[:-1]) if b == row.site]
    return bool(before) and all(a == site for a in before) and sites[-2:-1] != [site]


def _wait(d: Dumps, df: pd.DataFrame, head: _Head, waits: dict, skipped: bool) -> Diagnosis:
    """The Diagnosis of a wait in ``head``: what the ranks behind it do instead."""
    name, row, waiting, behind = head.group, head.call, head.waiting, head.behind
    about = {r: _whereabouts(d, df, r, waits) for r in behind}
    kinds = {k for k, _ in about.values()}
    args = (tuple(behind), name, row.seq, row.op, row.site)
    texts = "; ".join(t for _, t in about.values())
    if kinds == {"raised"}:
        return Diagnosis(
            "raised",
            f"{texts}, while {_ranks(waiting)} waited in {_call(d, row)} at {row.site}",
            *args,
        )
    if kinds == {"own_code"}:
        return Diagnosis(
            "own_code",
            f"{texts}, while {_ranks(waiting)} wait"
            f"{'s' if len(waiting) == 1 else ''} in {_call(d, row)} at {row.site}",
            *args,
        )
    if kinds == {"gone"}:
        own = df[(df.group == name) & df["rank"].isin(waiting)]
        again = all(_repeats(own[own["rank"] == r], row.seq) for r in waiting)
        why = (
            "it finished its loop early (uneven data? DistributedSampler(drop_last=True), or "
            "DDP's Join context), or crashed"
            if again
            else "in that call or before it (a rank that crashes inside a collective leaves no "
            "dump; gloo aborts one that receives more than its tensor holds: sizes that "
            "differ)"
        )
        return Diagnosis(
            "gone",
            (
                f"{_ranks(behind)} left no dump, while {_ranks(waiting)} wait"
                f"{'s' if len(waiting) == 1 else ''} in {_call(d, row)} at {row.site}"
                f"{', as in the step before' if again else ''}: its process ended, {why}"
            ),
            *args,
        )
    where = f"{_ranks(waiting)} wait{'s' if len(waiting) == 1 else ''} in it at {row.site}"
    line = f"{_ranks(behind)} never issued {_call(d, row)}; {where}; {texts}"
    if skipped:
        return Diagnosis(
            "skipped",
            f"{_ranks(behind)} skipped {_call(d, row)}; {where}; "
            f"{texts.replace(' waits in ', ' went on to ')}, which in every earlier "
            f"step came right after the call at {row.site}",
            *args,
        )
    cycle = [r for r in behind if r in waits and set(waiting) & set(heads_behind(d, df, waits[r]))]
    if cycle:
        groups = " and ".join(sorted({_group(d, name), _group(d, waits[cycle[0]].group)}))
        line += (
            f", which {_ranks(waiting)} never issued: a deadlock across {groups} (their "
            f"collectives issued in a different order, or one skipped)"
        )
        return Diagnosis("cycle", line, *args)
    return Diagnosis("waits", line, *args)


def _explain(d: Dumps, df: pd.DataFrame, head: _Head, waits: dict, skipped: bool) -> Diagnosis:
    """A wait's Diagnosis: the p2p one where every rank behind is blocked in a send or a
    receive, else ``_wait``'s."""
    blocked = {
        r: c.point_to_point(d.ranks[r].stacks) if r in d.ranks else None for r in head.behind
    }
    if head.behind and all(blocked.values()):
        row = head.call
        return _unmatched(
            d, head, blocked, (tuple(head.behind), head.group, row.seq, row.op, row.site)
        )
    return _wait(d, df, head, waits, skipped)


def _unmatched(d: Dumps, head: _Head, p2p: dict[int, dict], args: tuple) -> Diagnosis:
    """The "p2p" Diagnosis: ranks blocked in a send or a receive that the ranks waiting in
    ``head``'s call never answer, having left the loop of sends and receives (a pipeline's
    stages that disagree on the micro-batch count). The recorder keeps no gloo send or
    receive: the stacks say where each stood, and the suite's stacks where its schedule
    stood (its micro-batch count and position)."""
    members = d.groups.get(head.group, ("", []))[1]
    peers = _ranks(head.waiting)

    def who(r: int) -> str:
        return f"rank {r} (stage {members.index(r)})" if r in members else f"rank {r}"

    parts = []
    for r, p in sorted(p2p.items()):
        at = f"at {p['site']}, torch's {p['torch_site']}"
        if p.get("schedule"):
            at += f"; its schedule: {p['schedule']}"
        if p["op"] == "send":
            parts.append(f"{who(r)} sends to {peers}, which never receives it ({at})")
        elif p["op"] == "recv":
            parts.append(f"{who(r)} waits to receive from {peers}, which never sends ({at})")
        else:
            parts.append(f"{who(r)} is blocked in a send or receive with {peers} ({at})")
    waiting = "waits" if len(head.waiting) == 1 else "wait"
    line = (
        f"{'; '.join(parts)}: {peers} left its sends and receives and {waiting} in "
        f"{_call(d, head.call)} at {head.call.site}, which {_ranks(p2p)} never issued: the "
        "stages ran different numbers of micro-batches (a micro-batch count that differs "
        "between ranks?)"
    )
    return Diagnosis("p2p", line, *args)


def heads_behind(d: Dumps, df: pd.DataFrame, row) -> list[int]:
    """The members of ``row``'s group that have not issued ``row``'s call (a member with no
    call in the group at all among them)."""
    sub = df[df.group == row.group]
    last = sub.groupby("rank").seq.max()
    members = d.groups.get(row.group, ("", list(last.index)))[1] or list(last.index)
    return [int(r) for r in members if r in d.ranks and last.get(r, 0) < row.seq]


def diagnose_folder(folder: Path) -> Diagnosis:
    """``diagnose(load(folder))``: raises ``DumpError`` on a folder it cannot read."""
    return diagnose(load(folder))
