"""Two nodes for real: two network namespaces on this machine joined by a veth pair, addresses
only inside them, one torchrun per namespace (see docs/multinode.md).

Found to be needed with torch 2.13: ``--rdzv_conf=is_host=1`` on the node that owns the
endpoint address, ``--local_addr`` on both, ``GLOO_SOCKET_IFNAME`` naming the veth (both ends
carry the same name), ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, and ``timeout -k`` around each
torchrun (a plain timeout can be ignored while torchrun blocks in a store wait).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
NODES = ("pbnode0", "pbnode1")
ADDRS = ("10.231.7.1", "10.231.7.2")
IFACE = "pbveth0"
PORT = 29517
# Where namespaces cannot be created the tests skip, saying why; under CI="true" that is a
# failure (CI runs as root, and `make test` installs iproute2).
pytestmark = [
    pytest.mark.ci_needs("network namespaces (iproute2's `ip netns`, as root)"),
    pytest.mark.e2e,
]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _delete() -> None:
    for ns in NODES:
        _ip("netns", "del", ns)


@pytest.fixture(scope="module")
def two_hosts():
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2): cannot create network namespaces")
    _delete()
    steps = [
        *(("netns", "add", ns) for ns in NODES),
        ("link", "add", "pbvA", "type", "veth", "peer", "name", "pbvB"),
        ("link", "set", "pbvA", "netns", NODES[0]),
        ("link", "set", "pbvB", "netns", NODES[1]),
    ]
    for i, (ns, old) in enumerate(zip(NODES, ("pbvA", "pbvB"), strict=True)):
        steps += [
            ("-n", ns, "link", "set", old, "name", IFACE),
            ("-n", ns, "addr", "add", f"{ADDRS[i]}/24", "dev", IFACE),
            ("-n", ns, "link", "set", IFACE, "up"),
            ("-n", ns, "link", "set", "lo", "up"),
        ]
    for step in steps:
        r = _ip(*step)
        if r.returncode != 0:
            _delete()
            reason = f"cannot create network namespaces here (ip {' '.join(step)}: {r.stderr})"
            print(reason)
            pytest.skip(reason)
    yield
    _delete()


def node(i: int, args: list[str], limit: int = 200) -> subprocess.Popen:
    """torchrun for node ``i`` inside its namespace; node 0 hosts the rendezvous."""
    cmd = [
        "ip",
        "netns",
        "exec",
        NODES[i],
        "timeout",
        "-k",
        "10",
        str(limit),
        "env",
        f"GLOO_SOCKET_IFNAME={IFACE}",
        "OMP_NUM_THREADS=1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
        str(TORCHRUN),
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={ADDRS[0]}:{PORT}",
        f"--local_addr={ADDRS[i]}",
        *(["--rdzv_conf=is_host=1"] if i == 0 else []),
        "bench/run.py",
        *args,
    ]
    return subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def sweep(out: Path, values: str) -> list[str]:
    return [
        "--sweep",
        "bucket_cap_mb",
        "--values",
        values,
        "--model",
        "mlp",
        "--steps",
        "5",
        "--max-steps",
        "5",
        "--rounds",
        "1",
        "--warmup-steps",
        "1",
        "--profile-steps",
        "1",
        "--point-timeout",
        "30",
        "--out",
        str(out),
        "--no-report",
    ]


@pytest.mark.timeout(300)
def test_two_node_sweep(two_hosts, tmp_path):
    out = tmp_path / "run"
    procs = [node(i, sweep(out, "1,25")) for i in range(2)]
    outputs = [p.communicate(timeout=240) for p in procs]
    for p, (o, e) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, (o[-1500:], e[-3000:])
    df = pd.read_csv(out / "results.csv", keep_default_na=False)  # rank 0 of node 0 writes it
    failed = df[df["status"] != "ok"]
    assert failed.empty, failed[["point", "error"]].to_string()  # which point, and why
    assert len(df) == 4 and set(df["world_size"]) == {2}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["nodes"] == 2 and meta["ranks_per_node"] == 1 and meta["world_size"] == 2
    for point in df["point"]:  # each node wrote its rank's trace into the shared --out
        names = sorted(t.name.split(".")[0] for t in (out / "traces" / point).glob("*.json"))
        assert names == ["rank0", "rank1"], names
    assert "results:" in outputs[0][0]


@pytest.mark.timeout(300)
def test_a_lost_node_ends_the_job_and_keeps_finished_points(two_hosts, tmp_path):
    out = tmp_path / "run"
    procs = [node(i, sweep(out, "0.25,1,5,25,100")) for i in range(2)]
    try:
        deadline = time.monotonic() + 200
        while not (out / "results.csv").exists() or len(pd.read_csv(out / "results.csv")) < 2:
            assert procs[0].poll() is None and time.monotonic() < deadline, "no progress"
            time.sleep(0.3)
        pids = _ip("netns", "pids", NODES[1]).stdout.split()
        for pid in pids:  # the whole host goes: torchrun and its rank
            os.kill(int(pid), signal.SIGKILL)
        t0 = time.monotonic()
        _, e = procs[0].communicate(timeout=150)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    print("\n".join(line for line in e.splitlines() if line.startswith("error:")))
    assert procs[0].returncode not in (0, None)
    assert time.monotonic() - t0 < 120  # within the job's timeouts, not a hang
    assert "lost contact with the other ranks" in e, e[-3000:]
    # mid-point the peer's address is named; between points the group could not be formed
    assert ADDRS[1] in e or "while forming the point's group" in e, e[-3000:]
    assert "[rank0]: Traceback" not in e, e[-3000:]  # torchrun adds its own summary
    df = pd.read_csv(out / "results.csv")
    finished = df[df["status"] == "ok"]
    assert len(finished) >= 2 and len(df) <= 10
    assert (df["status"] == "error").sum() <= 1  # the point that was running, if recorded
