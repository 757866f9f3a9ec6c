"""``python -m bench.hang DIR``: why the job whose flight-recorder dumps ``DIR`` holds hung.

``DIR`` is a run folder's ``hangs/<point>/``, or the folder of any job run with
``TORCH_FR_BUFFER_SIZE`` and ``TORCH_FR_DUMP_TEMP_FILE`` (README, "When a job hangs"). Prints
the diagnosis, then each rank's last call per group and where its main thread stood; ``--torch``
adds what torch's own analyser finds in the same dumps.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from pathlib import Path

from bench.console import fail
from bench.hang import calls as c
from bench.hang.diagnose import diagnose
from bench.hang.dumps import DumpError, load

_SUITE = Path(__file__).resolve().parents[1]  # bench/: where a line of the suite's own is


def rank_lines(d) -> list[str]:
    df = c.calls(d)
    out = []
    for rank in d.world:
        dump = d.ranks.get(rank)
        if dump is None:
            out.append(f"  rank {rank}: no dump")
            continue
        last = df[df["rank"] == rank].groupby("group").tail(1)
        calls = ", ".join(
            f"{r.op} #{r.seq} (group {r.group}) at {r.site}" for r in last.itertuples()
        )
        stacks = dump.stacks or {}
        state = ""
        if stacks:
            frame = c.own_frame(stacks.get("raised_at") or c.main_thread_frames(stacks))
            state = f"; dumped ({stacks.get('reason')}) at {c.site(frame)}"
            if stacks.get("error"):
                state += f"; error: {str(stacks['error']).splitlines()[0][:160]}"
        out.append(f"  rank {rank}: last calls {calls or 'none'}{state}")
    return out


def listing(d, folder: Path) -> list[str]:
    """The lines after the diagnosis: how many ranks dumped, each one's last calls."""
    entries = [e for r in d.ranks.values() for e in r.record["entries"]]
    stackless = bool(entries) and not any(map(c.has_stacks, entries))
    note = " (no stacks in their entries, as in torch's JSON dumps: no source lines)"
    return [
        f"dumps of {len(d.ranks)} of {len(d.world)} ranks in {folder}{note if stackless else ''}:",
        *rank_lines(d),
    ]


def _where(e: BaseException) -> str:
    """``diagnose.py:59``: the innermost line of the suite's own code the error passed."""
    ours = [
        f
        for f in traceback.extract_tb(e.__traceback__)
        if Path(f.filename).resolve().is_relative_to(_SUITE)
    ]
    return f"{os.path.basename(ours[-1].filename)}:{ours[-1].lineno}" if ours else "?"


def could_not(folder: Path, e: Exception) -> str:
    """The one line for a diagnosis that failed: what failed and where, so it can be fixed."""
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return (
        f"could not diagnose {folder}: {type(e).__name__}{': ' if first else ''}{first} "
        f"(at {_where(e)}: a bug of bench.hang; please report it with the dumps)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hang", description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a folder of flight-recorder dumps, one per rank")
    p.add_argument(
        "--torch",
        action="store_true",
        help="also print the first problem torch's own analyser finds",
    )
    args = p.parse_args(argv)
    try:
        d = load(args.folder)
        lines = [diagnose(d).line, *listing(d, args.folder)]
    except DumpError as e:
        fail(str(e))
    except Exception as e:  # noqa: BLE001  (never a traceback: one line, and what still reads)
        with contextlib.suppress(Exception):  # the ranks' calls, where they still read
            print("\n".join(listing(d, args.folder)), flush=True)
        fail(could_not(args.folder, e))
    print("\n".join(lines))
    if args.torch:
        from bench.hang.torch_view import summary

        print(summary(d))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # piped into head: the reader has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (flushed at exit, never read)
        sys.exit(0)
