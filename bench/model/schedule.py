"""One training step simulated as two timelines: computation, and a queue of collectives.

A step is a *program*: the operations one rank's main stream executes in order.
``Compute(ms)`` occupies the computation timeline; ``Issue(c)`` hands collective ``c`` to its
communicator's queue and returns at once (an asynchronous launch); ``Wait(c)`` blocks the main
stream until ``c`` has finished. A queue runs collectives one at a time in the order they were
issued (every rank must issue them in the same order, and one communicator serialises them):
a collective starts at max(its issue, the previous one's end). Collectives of different
communicators (``Issue.queue``: a 2-D mesh's TP and DP groups) run beside each other, as
NCCL runs each communicator on its own stream.

The program builders below are the strategies' schedules:

- ``ddp_program``: forward, then backward cut at each gradient's ready time; a bucket is
  issued when its last gradient is ready (or, without overlap, after backward); the step waits
  for every bucket, then runs what follows backward (copy-back, optimiser).
- ``fsdp_program``: per unit, an all-gather before its forward (prefetched: issued when the
  previous unit's forward starts), again in backward under FULL_SHARD (prefetched at the later
  unit's backward), a reduce-scatter (NO_SHARD: all-reduce; HYBRID_SHARD: reduce-scatter in
  the shard group, then all-reduce of the shard across replicas) issued after its backward (and
  waited for at once, when the implementation blocks on it).
- ``tp_program``: tensor-parallel all-reduces block the stream where they occur (Megatron's f
  and g sit on the critical path); data-parallel buckets of the local gradients as DDP.
- ``with_blocking_calls``: such blocking calls, on a communicator of their own, spread through
  another program's forward or backward (FSDP over a TP mesh's data-parallel ranks).

``simulate`` yields the same columns the harness measures: step time, computation,
communication, overlap (communication under computation), exposed communication.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.analysis import interval_sets as iv


@dataclass(frozen=True)
class Compute:
    ms: float
    label: str = "compute"


COMM = "comm"  # the communicator a collective runs on unless it names another


@dataclass(frozen=True)
class Issue:
    name: str
    ms: float  # the collective's duration once it runs
    queue: str = COMM  # its communicator: one collective at a time on each


@dataclass(frozen=True)
class Wait:
    name: str


Op = Compute | Issue | Wait


@dataclass
class Timeline:
    compute: list[tuple[float, float, str]] = field(default_factory=list)
    comm: list[tuple[float, float, str]] = field(default_factory=list)
    end_ms: float = 0.0

    def metrics(self) -> dict[str, float]:
        c = iv.union(
            iv.as_intervals([a for a, _, _ in self.compute], [b for _, b, _ in self.compute])
        )
        m = iv.union(iv.as_intervals([a for a, _, _ in self.comm], [b for _, b, _ in self.comm]))
        comm, overlap = iv.length(m), iv.length(iv.intersect(c, m))
        return {
            "step_ms": self.end_ms,
            "compute_ms": iv.length(c),
            "comm_ms": comm,
            "overlap_ms": overlap,
            "exposed_comm_ms": comm - overlap,
            "overlap_pct": 100.0 * overlap / comm if comm > 0 else float("nan"),
        }


_EPS = 1e-12  # tolerance on remaining work: an operation within it of zero has finished


def _advance_stream(
    ops: list[Op], pc: int, now: float, issued: set[str], queues: dict, done: dict
) -> tuple[int, tuple[float, float, str] | None, str | None]:
    """Advance the main stream from op ``pc`` through everything that takes no time, up to a
    computation or a wait for an unfinished collective: (next op, the computation started as
    (remaining ms, started at, label) or None, the collective waited for or None)."""
    while pc < len(ops):
        op = ops[pc]
        pc += 1
        if isinstance(op, Compute):
            if op.ms > 0:
                return pc, (op.ms, now, op.label), None
        elif isinstance(op, Issue):
            if op.name in issued:
                raise ValueError(f"collective {op.name!r} issued twice")
            issued.add(op.name)
            queues.setdefault(op.queue, []).append(op)
        else:
            if op.name not in issued:
                raise ValueError(f"wait for {op.name!r}, which was never issued")
            if op.name not in done:
                return pc, None, op.name
    return pc, None, None


def _run_compute(
    busy: tuple[float, float, str], work: float, ends: bool, now: float, tl: Timeline
) -> tuple[float, float, str] | None:
    """The computation in progress after ``work`` ms of it ran: None once it is over (ended at
    ``now``, recorded in ``tl``), else what remains of it."""
    rem = busy[0] - work
    if rem <= _EPS * max(1.0, busy[0]) or ends:
        tl.compute.append((busy[1], now, busy[2]))
        return None
    return (rem, busy[1], busy[2])


def _start_queued(queues: dict, running: dict, now: float, done: dict) -> bool:
    """Start the next collective of every idle communicator; whether one of them took no time
    (it is done at once)."""
    instant = False
    for q, pending in queues.items():
        if q in running or not pending:
            continue
        nxt = pending.pop(0)
        if nxt.ms > 0:
            running[q] = [nxt.ms, now, nxt.name]
        else:
            done[nxt.name] = now
            instant = True
    return instant


def simulate(program: list[Op], *, share: float = 1.0) -> Timeline:
    """Run a program (see the module docstring) and return its two timelines.

    ``share``: the speed computation and communication each keep while both run. 1 when they
    use separate hardware (a GPU's compute units and NCCL's channels, or a CPU rank with a core
    for each); on a CPU rank with one core, gloo's thread and the main thread time-share it and
    each runs at about half speed (processor sharing, ``share`` = 0.5).
    """
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    tl = Timeline()
    ops = list(program)
    pc = 0  # next op of the main stream
    now = 0.0
    busy: tuple[float, float, str] | None = None  # (remaining ms, started at, label)
    waiting: str | None = None
    queues: dict[str, list[Issue]] = {}  # per communicator: issued, not started
    running: dict[str, list] = {}  # per communicator: [remaining ms, started at, name]
    done: dict[str, float] = {}
    issued: set[str] = set()
    while True:
        if busy is None and waiting is None:
            pc, busy, waiting = _advance_stream(ops, pc, now, issued, queues, done)
        if _start_queued(queues, running, now, done):
            waiting = None if waiting in done else waiting
            continue  # a zero-length collective finished: the stream may go on
        if busy is None and not running:
            if waiting is not None:  # cannot happen: a waited one is queued or running
                raise RuntimeError(f"waiting for {waiting!r} with nothing in flight")
            if pc < len(ops):
                continue
            break
        rate = share if (busy is not None and running) else 1.0
        dt_c = busy[0] / rate if busy is not None else float("inf")
        dt_m = {q: r[0] / rate for q, r in running.items()}
        dt = min(dt_c, *dt_m.values()) if dt_m else dt_c
        now += dt
        if busy is not None:
            busy = _run_compute(busy, dt * rate, dt == dt_c, now, tl)
        for q, r in list(running.items()):
            r[0] -= dt * rate
            if r[0] <= _EPS * 1e3 or dt == dt_m[q]:
                tl.comm.append((r[1], now, r[2]))
                done[r[2]] = now
                if waiting == r[2]:
                    waiting = None
                del running[q]
    tl.comm.sort()
    tl.end_ms = now
    return tl


# -- DDP ---------------------------------------------------------------------------------------
def native_buckets(sizes: list[int], cap: int, first_cap: int | None = None) -> list[list[int]]:
    """DistributedDataParallel's buckets (the reducer's assignment by size, used when it
    rebuilds buckets in the order gradients became ready after the first step): a gradient is
    added, then the bucket closes once it holds ``limit`` bytes or more; the first bucket's
    limit is ``first_cap`` (1 MiB when bucket_cap_mb is left at its default, else the cap)."""
    limits = [first_cap or cap, cap]
    out, cur, size = [], [], 0
    for i, nbytes in enumerate(sizes):
        cur.append(i)
        size += nbytes
        if size >= limits[min(len(out), 1)]:
            out.append(cur)
            cur, size = [], 0
    return out + ([cur] if cur else [])


def reference_buckets(sizes: list[int], cap: int) -> list[list[int]]:
    """Our ReferenceDDP's buckets (parallel_kernels/ddp.py ``plan_buckets``): a bucket closes
    before the gradient that would take it over the cap; a gradient larger than the cap sits
    alone."""
    out, cur, size = [], [], 0
    for i, nbytes in enumerate(sizes):
        if cur and size + nbytes > cap:
            out.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += nbytes
    return out + ([cur] if cur else [])


def backward_with_issues(
    backward_ms: float, ready_ms: list[float], issues: dict[int, list[Issue]]
) -> list[Op]:
    """Backward's computation cut at the gradients' ready times, ``issues[i]`` issued as soon as
    gradient ``i`` is ready."""
    prog: list[Op] = []
    done = 0.0
    for i, r in enumerate(ready_ms):
        if i in issues:
            r = min(max(r, done), backward_ms)
            prog.append(Compute(r - done, "backward"))
            done = r
            prog.extend(issues[i])
    prog.append(Compute(max(backward_ms - done, 0.0), "backward"))
    return prog


def ddp_program(
    *,
    forward_ms: float,
    backward_ms: float,
    after_ms: float,
    ready_ms: list[float],
    buckets: list[list[int]],
    bucket_ms: list[float],
    overlap: bool = True,
) -> list[Op]:
    issues = [Issue(f"bucket{b}", ms) for b, ms in enumerate(bucket_ms)]
    prog: list[Op] = [Compute(forward_ms, "forward")]
    if overlap:
        at: dict[int, list[Issue]] = {}
        # Buckets go out strictly in order: bucket b waits for its own last gradient and for
        # bucket b-1 (a later bucket ready first is held back, as DDP and our reference do).
        last = -1
        for b, members in enumerate(buckets):
            last = max(last, max(members))
            at.setdefault(last, []).append(issues[b])
        prog += backward_with_issues(backward_ms, ready_ms, at)
    else:
        prog += [Compute(backward_ms, "backward"), *issues]
    prog += [Wait(i.name) for i in issues]
    prog.append(Compute(after_ms, "after backward"))
    return prog


# -- FSDP --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Unit:
    forward_ms: float
    backward_ms: float
    gather_ms: float  # all-gather of the unit's parameters
    reduce_ms: float  # reduce-scatter (or, NO_SHARD, all-reduce) of its gradients


def fsdp_program(
    units: list[Unit],
    *,
    after_ms: float,
    reshard_after_forward: bool = True,
    shard: bool = True,
    prefetch: bool = True,
    reduce_blocks: bool = False,
) -> list[Op]:
    """Units in forward order. ``shard=False`` is NO_SHARD (no gathers, gradients all-reduced);
    ``reshard_after_forward`` False is SHARD_GRAD_OP (no gather in backward);
    ``reduce_blocks``: backward waits for each unit's reduction before going on (our reference,
    which reduces inside the gather's backward)."""
    prog: list[Op] = []
    issued: set[str] = set()

    def gather(name: str, ms: float) -> None:
        if name not in issued:
            issued.add(name)
            prog.append(Issue(name, ms))

    k = len(units)
    for u, unit in enumerate(units):
        if shard:
            gather(f"ag_f{u}", unit.gather_ms)
            prog.append(Wait(f"ag_f{u}"))
            if prefetch and u + 1 < k:
                gather(f"ag_f{u + 1}", units[u + 1].gather_ms)
        prog.append(Compute(unit.forward_ms, f"forward {u}"))
    for u in reversed(range(k)):
        unit = units[u]
        if shard and reshard_after_forward:
            gather(f"ag_b{u}", unit.gather_ms)
            prog.append(Wait(f"ag_b{u}"))
            if prefetch and u > 0:
                gather(f"ag_b{u - 1}", units[u - 1].gather_ms)
        prog.append(Compute(unit.backward_ms, f"backward {u}"))
        prog.append(Issue(f"rs{u}", unit.reduce_ms))
        if reduce_blocks:
            prog.append(Wait(f"rs{u}"))
    prog += [Wait(f"rs{u}") for u in range(k)]
    prog.append(Compute(after_ms, "after backward"))
    return prog


# -- tensor parallel ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Buckets:
    """Data-parallel gradient buckets: each gradient's ready time in backward (ms), the
    gradients of each bucket, and each bucket's all-reduce (ms)."""

    ready_ms: list[float]
    members: list[list[int]]
    ms: list[float]


def tp_program(
    *,
    forward_ms: float,
    backward_ms: float,
    after_ms: float,
    forward_comm_ms: list[float],
    backward_comm_ms: list[float],
    buckets: Buckets | None = None,
) -> list[Op]:
    """Blocking TP all-reduces spread evenly through forward and backward (each layer's
    collective sits between its computations); data-parallel ``buckets``, if any, issued from
    the gradients' ready times as in DDP."""

    def blocking(total_ms: float, comms: list[float], tag: str) -> list[Op]:
        piece = total_ms / (len(comms) + 1)
        prog: list[Op] = []
        for j, ms in enumerate(comms):
            prog += [Compute(piece, tag), Issue(f"{tag} tp{j}", ms), Wait(f"{tag} tp{j}")]
        return [*prog, Compute(piece, tag)]

    prog = blocking(forward_ms, list(forward_comm_ms), "forward")
    if buckets is None or not buckets.members:
        prog += blocking(backward_ms, list(backward_comm_ms), "backward")
        return [*prog, Compute(after_ms, "after backward")]
    # Backward: TP collectives at even points of the computation, DP buckets at their ready
    # times; both are cut into one sequence ordered by computation done.
    k = len(backward_comm_ms)
    marks = [(backward_ms * (j + 1) / (k + 1), 0, j) for j in range(k)]
    last = -1
    for b, members in enumerate(buckets.members):
        last = max(last, max(members))
        marks.append((buckets.ready_ms[last], 1, b))
    done = 0.0
    for at, kind, j in sorted(marks):
        at = min(max(at, done), backward_ms)
        prog.append(Compute(at - done, "backward"))
        done = at
        if kind == 0:
            prog += [Issue(f"backward tp{j}", backward_comm_ms[j]), Wait(f"backward tp{j}")]
        else:
            prog.append(Issue(f"bucket{j}", buckets.ms[j]))
    prog.append(Compute(backward_ms - done, "backward"))
    prog += [Wait(f"bucket{b}") for b in range(len(buckets.members))]
    return [*prog, Compute(after_ms, "after backward")]


def with_blocking_calls(
    program: list[Op], phase: str, phase_ms: float, comms: list[float], queue: str = "tp"
) -> list[Op]:
    """``program`` with blocking collectives (Megatron's TP all-reduces) at even points of its
    computation labelled ``phase`` ("forward" or "backward", ``phase_ms`` of it in all), as
    ``tp_program`` spreads them, each issued on ``queue`` and waited for at once; what else the
    program issues stays where it is (FSDP's gathers and reductions, on their own communicator).
    """
    k = len(comms)
    marks = [phase_ms * (j + 1) / (k + 1) for j in range(k)]
    out: list[Op] = []
    done, j = 0.0, 0
    for op in program:
        if not (isinstance(op, Compute) and op.label.startswith(phase)):
            out.append(op)
            continue
        left = op.ms
        while j < k and marks[j] < done + left:
            cut = max(marks[j] - done, 0.0)
            out.append(Compute(cut, op.label))
            done, left = done + cut, left - cut
            out += [Issue(f"{phase} tp{j}", comms[j], queue), Wait(f"{phase} tp{j}")]
            j += 1
        out.append(Compute(left, op.label))
        done += left
    if j < k:
        raise ValueError(f"{k - j} of {k} calls fall past the program's {phase} ({done} ms)")
    return out
