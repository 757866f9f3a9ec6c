"""How FSDP lays parameters out, as arithmetic: the shard group, the ZeRO state and traffic
formulas, and which submodules are units. Shared by the reference kernel (``fsdp_reference.py``),
the strategy's apply functions (``fsdp.py``) and TP's data-parallel dimension (``mesh.py``)."""

from __future__ import annotations

from torch import nn

from parallel_kernels.workload import modules_of_types, workload_of

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")


def shard_group_size(strategy: str, n: int, shard_size: int | None = None) -> int:
    """S, the ranks one parameter is sharded over: n, 1 for NO_SHARD, and for HYBRID_SHARD
    ``shard_size`` (default n / 2), which must leave 2 or more replicas of 2 or more ranks."""
    if strategy == "NO_SHARD":
        return 1
    if strategy != "HYBRID_SHARD":
        return n
    s = shard_size or n // 2
    if n < 4 or s < 2 or n % s or s == n:
        raise ValueError(
            f"HYBRID_SHARD needs a shard group of 2 or more ranks dividing the "
            f"world size into 2 or more replicas; world size {n}, shard size {s}"
        )
    return s


def zero_state_bytes(psi: int, n: int, strategy: str, shard_size: int | None = None) -> float:
    """Per-rank bytes of parameters, gradients and AdamW state in fp32 training, after the ZeRO
    paper's accounting (Rajbhandari et al. 2020, section 5) with fp32 everywhere: 4 bytes of
    parameter, 4 of gradient and K = 8 of optimiser state (two moments) per parameter, i.e.
    16 Psi replicated (DDP, NO_SHARD), 4 Psi + 12 Psi / S for ZeRO-2 (SHARD_GRAD_OP), 16 Psi / S
    for ZeRO-3 (FULL_SHARD), S the shard-group size (n, or the hybrid group). The paper's
    mixed-precision figures are (2 + 2 + K) Psi, 2 Psi + (2 + K) Psi / N and (2 + 2 + K) Psi / N
    with K = 12. FSDP's SHARD_GRAD_OP also shards parameters at rest (it keeps them gathered
    only from forward to backward), so it measures below the paper's ZeRO-2 figure."""
    s = shard_group_size(strategy, n, shard_size)
    if strategy == "SHARD_GRAD_OP":
        return 4 * psi + 12 * psi / s
    return 16 * psi / s


def fsdp_comm_bytes(
    psi: int, n: int, strategy: str, shard_size: int | None = None, *, elem_bytes: int = 4
) -> float:
    """Payload per step, each collective counted by its input as traces record it, with b =
    ``elem_bytes`` per element: an all-gather sends a shard (b Psi / S), a reduce-scatter the
    full gradient (b Psi), a hybrid's replica all-reduce a shard. FULL_SHARD gathers twice
    (forward, and again in backward), SHARD_GRAD_OP once, NO_SHARD all-reduces b Psi. Padding
    is not counted."""
    b = elem_bytes
    if strategy == "NO_SHARD":
        return b * psi
    s = shard_group_size(strategy, n, shard_size)
    gathers = 1 if strategy == "SHARD_GRAD_OP" else 2
    replica = b * psi / s if strategy == "HYBRID_SHARD" else 0
    return gathers * b * psi / s + b * psi + replica


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The submodules that get a flat parameter each: the workload's unit classes (a
    transformer's blocks, a ResNet's bottlenecks), else each linear layer (an MLP); the root
    takes the rest (embeddings, final norm, head)."""
    wl = workload_of(model)
    if wl is not None and wl.fsdp_units:
        units = modules_of_types(model, wl.fsdp_units)
        if not units:
            names = ", ".join(t.__name__ for t in wl.fsdp_units)
            raise ValueError(
                f"workload {wl.name}: its model has no module of its fsdp_units ({names})"
            )
        return units
    blocks = getattr(model, "blocks", None)
    if blocks is not None:  # the built-in Transformer built outside the registry
        return list(blocks)
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def unit_params(module: nn.Module, units: list[nn.Module], *, frozen: bool = True):
    """[(unit module, [(owner, attribute, parameter), ...]), ...]: each unit's parameters in
    module order, the root last with whatever the units left; units without any are dropped.
    ``frozen=False`` leaves out the parameters that take no gradient (``requires_grad=False``)."""
    claimed: set[int] = set()
    out = []
    for m in [*units, module]:
        params = [
            (owner, name, p)
            for owner in m.modules()
            for name, p in list(owner._parameters.items())
            if p is not None and id(p) not in claimed and (frozen or p.requires_grad)
        ]
        if params:
            claimed.update(id(p) for _, _, p in params)
            out.append((m, params))
    return out
