"""``python -m bench.hang DIR``: why the job whose flight-recorder dumps ``DIR`` holds hung.

``DIR`` is a run folder's ``hangs/<point>/``, or the folder of any job run with
``TORCH_FR_BUFFER_SIZE`` and ``TORCH_FR_DUMP_TEMP_FILE`` (README, "When a job hangs"). Prints
the diagnosis, then each rank's last call per group and where its main thread stood; ``--torch``
adds what torch's own analyser finds in the same dumps.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench.console import fail
from bench.hang import calls as c
from bench.hang.diagnose import diagnose
from bench.hang.dumps import DumpError, load


def rank_lines(d) -> list[str]:
    df = c.calls(d)
    out = []
    for rank in d.world:
        dump = d.ranks.get(rank)
        if dump is None:
            out.append(f"  rank {rank}: no dump")
            continue
        last = df[df["rank"] == rank].groupby("group").tail(1)
        calls = ", ".join(f"{r.op} #{r.seq} (group {r.group}) at {r.site}"
                          for r in last.itertuples())  # fmt: skip
        stacks = dump.stacks or {}
        state = ""
        if stacks:
            frame = c.own_frame(stacks.get("raised_at") or c.main_thread_frames(stacks))
            state = f"; dumped ({stacks.get('reason')}) at {c.site(frame)}"
            if stacks.get("error"):
                state += f"; error: {str(stacks['error']).splitlines()[0][:160]}"
        out.append(f"  rank {rank}: last calls {calls or 'none'}{state}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hang", description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a folder of flight-recorder dumps, one per rank")
    p.add_argument("--torch", action="store_true",
                   help="also print the first problem torch's own analyser finds")  # fmt: skip
    args = p.parse_args(argv)
    try:
        d = load(args.folder)
    except DumpError as e:
        fail(str(e))
    diag = diagnose(d)
    print(diag.line)
    print(f"dumps of {len(d.ranks)} of {len(d.world)} ranks in {args.folder}:")
    print("\n".join(rank_lines(d)))
    if args.torch:
        from bench.hang.torch_view import first_problem

        print(f"torch's analyser: {first_problem(d)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # piped into head: the reader has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  (flushed at exit, never read)
        sys.exit(0)
