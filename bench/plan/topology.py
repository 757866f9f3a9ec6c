"""The target's links: what a collective costs inside a node and across nodes, from link presets
(``bench.model.links``) or from collectives fitted to a ``--sweep message_size`` run of this
machine, and the share of a core computation keeps while communication runs beside it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.model.comm import load_runs
from bench.model.links import FIELDS, LinkCosts, parse_link

DEFAULT_LINKS = "nvlink4,ib_ndr"  # a GPU target's, where --link is not given


def link_names(links: str) -> list[str]:
    """``--link``'s one or two links (inside a node, across nodes), each a preset or
    ``alpha=..,bw=..``: checked, or a one-line ValueError."""
    names: list[str] = []
    for token in (t.strip() for t in links.split(",")):
        # a custom link's later fields (beta=, bw=, gamma=) belong to the alpha= before them
        if names and token.partition("=")[0].strip() in FIELDS[1:]:
            names[-1] += f",{token}"
        elif token:
            names.append(token)
    names = names or ["nvlink4"]
    if len(names) > 2:
        raise ValueError(f"--link takes one or two links (intra-node,inter-node), got {links}")
    for name in names:
        parse_link(name)
    return names


@dataclass(frozen=True)
class InStep:
    """Collectives' costs at ``factor`` times theirs: what a step pays for them where it pays
    more than the collective alone (``bench.roofline.step_comm``)."""

    costs: object
    factor: float

    def time(self, *args, **kwargs) -> float:
        return self.factor * self.costs.time(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.costs, name)


@dataclass(frozen=True)
class Topology:
    """The costs of a collective inside a node and across nodes (``time(collective, bytes,
    ranks)``: a link preset's, or collectives fitted on this machine), the share of a core
    computation keeps while communication runs beside it (``predict.overlap_share``), and the
    factor a step pays on its collectives over their cost alone (``in_step``: 1 but in a CPU
    plan priced without a calibration launch, ``calibration._links``)."""

    intra: object
    inter: object
    gpus_per_node: int
    about: str
    share: float = 1.0
    in_step: float = 1.0

    @classmethod
    def of_links(cls, links: str, gpus_per_node: int, share: float = 1.0) -> Topology:
        names = link_names(links)
        intra, inter = LinkCosts(parse_link(names[0])), LinkCosts(parse_link(names[-1]))
        about = f"inside a node {intra.link.describe()}; across nodes {inter.link.describe()}"
        return cls(intra, inter, gpus_per_node, about, share)

    @classmethod
    def fitted(cls, run: Path, gpus_per_node: int, share: float) -> Topology:
        """Collectives fitted to a ``--sweep message_size`` run of this machine, both links."""
        costs = load_runs([run])
        return cls(
            costs, costs, gpus_per_node, f"{costs.backend} collectives fitted to {run}", share
        )

    def of_world(self, world: int):
        """The costs of a group of ``world`` ranks laid from the first: inside a node while it
        fits in one, else across nodes (a ring is as slow as its slowest hop)."""
        costs = self.intra if world <= self.gpus_per_node else self.inter
        return costs if self.in_step == 1.0 else InStep(costs, self.in_step)
