"""A user's own 2-rank gloo script, with none of the suite's code, that hangs one way per
scenario; each rank writes torch's own flight-recorder dump when it stops.

Run as torchrun would (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set), with
``TORCH_FR_BUFFER_SIZE`` and ``TORCH_FR_DUMP_TEMP_FILE``: a rank dumps ``<prefix><rank>`` (the
pickle of ``torch._C._distributed_c10d._dump_fr_trace()``; with ``FR_JSON_DUMP_PREFIX`` set, the
JSON of ``_dump_fr_trace_json()`` too) when it stops, its collective timed out, its peer gone or
its loop done, then ends its process group, so that a peer waiting stops at once.
``make_dumps.py`` runs each scenario and keeps the dumps.

Scenarios (argv[1]); the lines marked ``# NAME`` are the ones a diagnosis should name:

- ``after_loop``: ``if rank == 0: all_reduce(loss)`` after the training loop;
- ``in_loop``: the same inside the loop, in one step, with the gradients' size;
- ``sizes``: a broadcast of 999 elements from rank 0 into 1000 on rank 1 (gloo lets it
  through: the ranks go on, their records disagree);
- ``aborted``: an all-reduce of 1000 elements on rank 0 and 999 on rank 1 (gloo aborts rank 1,
  which receives more than its tensor holds: it leaves no dump);
- ``order``: an all-reduce and a broadcast issued in a different order on the two ranks;
- ``gone``: rank 1 ends (``os._exit``) in the third step, before its all-reduce, no dump;
- ``raises``: rank 1 raises in its own code in the third step;
- ``uneven``: rank 0 runs a third step; rank 1 waits at the barrier after its loop;
- ``groups``: two groups' all-reduces issued in a different order (a deadlock across them);
- ``p2p``: each step sends rank 0's activations to rank 1 before the all-reduce (gloo's
  records hold no point-to-point call); rank 0 then issues a last all-reduce alone;
- ``none``: every rank issues the same calls: no hang.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

STEPS = 3
TIMEOUT_S = float(os.environ.get("SCRIPT_TIMEOUT_S", "2"))


def dump(rank: int) -> None:
    """What a user adds to their script: torch's dump, to the prefix torch documents."""
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
    with open(f"{prefix}{rank}", "wb") as f:
        f.write(_dump_fr_trace())
    if json_prefix := os.environ.get("FR_JSON_DUMP_PREFIX"):
        with open(f"{json_prefix}{rank}", "wb") as f:
            f.write(_dump_fr_trace_json())


def step(rank: int, k: int, scenario: str, grad: torch.Tensor, aux) -> None:
    if scenario == "p2p":
        act = torch.ones(64)
        if rank == 0:
            dist.send(act, dst=1)  # SEND
        else:
            dist.recv(act, src=0)  # RECV
    if scenario == "gone" and rank == 1 and k == 2:
        os._exit(3)  # the process ends: no dump
    if scenario == "raises" and rank == 1 and k == 2:
        raise RuntimeError("bad batch on rank 1")  # RAISES
    if scenario == "groups" and k == 2:
        if rank == 0:
            dist.all_reduce(grad)  # GROUPS-0
            dist.all_reduce(grad, group=aux)
        else:
            dist.all_reduce(grad, group=aux)  # GROUPS-1
            dist.all_reduce(grad)
        return
    if scenario == "order" and k == 2:
        if rank == 0:
            dist.all_reduce(grad)  # ORDER-0
            dist.broadcast(grad, src=0)
        else:
            dist.broadcast(grad, src=0)  # ORDER-1
            dist.all_reduce(grad)
        return
    if scenario == "sizes" and k == 1:
        dist.broadcast(torch.ones(999 if rank == 0 else 1000), src=0)  # SIZES
    if scenario == "aborted" and k == 2:
        dist.all_reduce(torch.ones(1000 if rank == 0 else 999))  # ABORTED
    dist.all_reduce(grad)  # GRAD
    if scenario == "in_loop" and rank == 0 and k == 1:
        dist.all_reduce(torch.ones_like(grad))  # IN-LOOP


def main() -> int:
    scenario = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    aux = dist.new_group([0, 1]) if scenario == "groups" else None
    grad, loss = torch.ones(289), torch.ones(1)
    try:
        steps = STEPS if scenario != "uneven" or rank == 0 else STEPS - 1
        for k in range(steps):
            step(rank, k, scenario, grad, aux)
        if scenario == "uneven":
            dist.barrier()  # BARRIER
        if scenario in ("after_loop", "p2p") and rank == 0:
            dist.all_reduce(loss)  # AFTER-LOOP
    except Exception as e:  # noqa: BLE001  (whatever ends it: say what, dump)
        print(f"rank {rank}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        return 1
    finally:
        dump(rank)
        dist.destroy_process_group()  # its connections closed: a peer waiting stops at once
    print(f"rank {rank}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
