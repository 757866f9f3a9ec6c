"""Link presets for what-if predictions: the latency and bandwidth we assume, and why.

Bandwidths are the per-direction peaks of one GPU's link (what a ring moves a rank's chunks
over), from the vendors' datasheets; nccl-tests typically reaches 80-90 % of them as busbw, so
predictions made with these presets are optimistic by about that much. Latencies (alpha, per
message step of an algorithm) are our assumption of NCCL's per-step cost on that fabric, a few
microseconds, not a datasheet figure: at the sizes of gradient buckets the bandwidth term
dominates. gamma (the reduction) is taken as 0: NCCL reduces inside its kernels at memory
bandwidth, well above any of these links.

With a preset, all-reduce costs the faster of NCCL's ring and double binary tree (what NCCL's
tuner picks between); the other collectives are rings (comm.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.model.comm import ALGORITHMS, ALTERNATIVES


@dataclass(frozen=True)
class Link:
    name: str
    alpha_s: float  # per message step
    bandwidth_GBps: float  # per direction, GB = 1e9 bytes
    source: str
    gamma_s_per_byte: float = 0.0

    @property
    def beta_s_per_byte(self) -> float:
        return 1e-9 / self.bandwidth_GBps

    def describe(self) -> str:
        return (
            f"{self.name}: alpha {self.alpha_s * 1e6:g} us, {self.bandwidth_GBps:g} GB/s per "
            f"direction ({self.source})"
        )


PRESETS: dict[str, Link] = {
    link.name: link
    for link in (
        Link("nvlink4", 3e-6, 450.0, "H100 SXM NVLink 4: 900 GB/s total per GPU, NVIDIA datasheet"),
        Link("nvlink3", 3e-6, 300.0, "A100 SXM NVLink 3: 600 GB/s total per GPU, NVIDIA datasheet"),
        Link("ib_ndr", 5e-6, 50.0, "InfiniBand NDR, 400 Gb/s per port and GPU (rail-optimised)"),
        Link("ib_hdr", 5e-6, 25.0, "InfiniBand HDR, 200 Gb/s per port and GPU (rail-optimised)"),
        Link("eth_100g", 15e-6, 12.5, "100 Gb/s Ethernet (RoCE), one port per GPU"),
        Link("eth_25g", 30e-6, 3.125, "25 Gb/s Ethernet, one port per node"),
    )
}


FIELDS = ("alpha", "beta", "bw", "gamma")  # a custom link's, alpha first


def parse_link(text: str) -> Link:
    """A preset name, or ``alpha=SECONDS,beta=SECONDS_PER_BYTE`` (or ``bw=GB/s`` instead of
    beta; optional ``gamma=SECONDS_PER_BYTE``)."""
    text = text.strip()
    if text in PRESETS:
        return PRESETS[text]
    if "=" not in text:
        raise ValueError(
            f"unknown link preset {text!r} (known: {', '.join(PRESETS)}; or "
            f"alpha=SECONDS,beta=SECONDS_PER_BYTE)"
        )
    fields: dict[str, float] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in FIELDS:
            raise ValueError(f"link: unknown key {key!r} ({', '.join(FIELDS)})")
        try:
            fields[key] = float(value)
        except ValueError:
            raise ValueError(f"link: {key}={value!r} is not a number") from None
        if not fields[key] >= 0 or (key in ("beta", "bw") and fields[key] == 0):
            raise ValueError(f"link: {key} must be positive, got {value}")
    if "alpha" not in fields or ("beta" in fields) == ("bw" in fields):
        raise ValueError("link: give alpha and one of beta or bw, e.g. alpha=5e-6,beta=2e-11")
    bw = fields["bw"] if "bw" in fields else 1e-9 / fields["beta"]
    return Link(
        "custom", fields["alpha"], bw, "given on the command line", fields.get("gamma", 0.0)
    )


@dataclass(frozen=True)
class LinkCosts:
    """Collective costs on a link, with NCCL's algorithms (the ``CommModel`` interface)."""

    link: Link

    def time(self, collective: str, nbytes: float, n: int, impl: str = "native") -> float:
        del impl
        a, b, g = self.link.alpha_s, self.link.beta_s_per_byte, self.link.gamma_s_per_byte
        choices = (ALGORITHMS["nccl"][collective], *ALTERNATIVES["nccl"].get(collective, ()))
        return min(alg.time(nbytes, n, a, b, g) for alg in choices)

    def interval_ends(self) -> None:
        """No interval: a link's figures are given, not measured."""
        return None
