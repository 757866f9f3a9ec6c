"""Reference sharded data parallelism (ZeRO) over per-unit flat parameters.

Each unit (a transformer block, a linear layer; the root takes whatever parameters are left)
flattens its parameters into one fp32 vector, padded to a multiple of the shard-group size S;
each rank keeps 1/S of it as the trainable leaf, so gradients and optimiser state exist only for
the local shard. Before a unit's forward its shard is all-gathered inside the shard group and
the unit's parameters become views of the gathered vector; the gather is an autograd function
whose backward reduce-scatters the gradient of the full vector back to shards (and, for
HYBRID_SHARD, all-reduces the shards across the replicate group), averaged over all ranks.

Strategies (the ZeRO paper's stages; Rajbhandari et al., SC 2020):
- FULL_SHARD (ZeRO-3): the gathered parameters are freed after the unit's forward; what
  backward needs of them is recorded as a position in the unit (saved-tensor hooks) and
  re-gathered when backward first reads it (a unit whose parameters backward never reads, such
  as a first layer whose input needs no gradient, is not gathered again). Per step: all-gather
  forward + all-gather backward + reduce-scatter, each of (S-1)/S x the unit's bytes per rank.
- SHARD_GRAD_OP (ZeRO-2): the gathered parameters stay alive until backward (no second
  all-gather); gradients and optimiser state are still sharded.
- NO_SHARD: S = 1, gradients all-reduced (DDP-like).
- HYBRID_SHARD: shard inside groups of S ranks, replicate across the N/S groups.

Frozen parameters (``requires_grad=False``) are kept whole on every rank, outside the flat
parameters: they take no gradient and no optimiser state, so there is nothing to shard but
their own bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from parallel_kernels.ddp import CommStats
from parallel_kernels.dims import ParallelDims
from parallel_kernels.fsdp_layout import STRATEGIES, shard_group_size, unit_params
from parallel_kernels.groups import split

# The current names of all_gather_into_tensor / reduce_scatter_tensor (torch >= 2.12).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class _Groups:
    # None is the default (world) group, as everywhere in torch.distributed: whether a group is
    # used at all is decided by the sizes below.
    world: dist.ProcessGroup | None
    shard: dist.ProcessGroup | None  # used when shard_size > 1
    replicate: dist.ProcessGroup | None  # used when n // shard_size > 1
    n: int
    shard_size: int


def _make_groups(group, strategy: str, shard_size: int | None) -> _Groups:
    n = dist.get_world_size(group)
    s = shard_group_size(strategy, n, shard_size)
    shard_pg = replicate_pg = None
    if 1 < s < n:  # hybrid: a (replicate, shard) grid, shard groups of consecutive ranks
        replicate_lines, shard_lines = ParallelDims(world=n, shard_group=s).dp_grid_lines()
        shard_pg, replicate_pg = split(group, shard_lines), split(group, replicate_lines)
    elif s == n:
        shard_pg = group
    else:
        replicate_pg = group
    return _Groups(world=group, shard=shard_pg, replicate=replicate_pg, n=n, shard_size=s)


class _Unit:
    """One flat parameter: the module it feeds, where each original parameter sits in it."""

    def __init__(
        self,
        module: nn.Module,
        params: list[tuple[nn.Module, str, nn.Parameter]],
        groups: _Groups,
        strategy: str,
        stats: CommStats,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        self.module, self.groups, self.strategy, self.stats = module, groups, strategy, stats
        self.compute_dtype = compute_dtype  # mixed precision: gather and compute in this dtype
        self.slots = []  # (owner module, attribute, offset, shape)
        # A parameter shared by two modules (a language model's head tied to its embedding) is
        # stored once: its second name is a view of the same slice, and backward adds the
        # gradients of both uses into that slice.
        first: dict[int, int] = {}
        offset = 0
        for owner, name, p in params:
            if id(p) not in first:
                first[id(p)] = offset
                offset += p.numel()
            self.slots.append((owner, name, first[id(p)], p.shape))
        self.numel = offset
        s = groups.shard_size
        self.padded = -(-offset // s) * s
        full = torch.zeros(self.padded, dtype=params[0][2].dtype, device=params[0][2].device)
        for (_, _, off, _), (_, _, p) in zip(self.slots, params, strict=True):
            full[off : off + p.numel()] = p.detach().reshape(-1)
        rank = dist.get_rank(groups.shard) if groups.shard_size > 1 else 0
        self.shard = nn.Parameter(full.chunk(s)[rank].clone())
        for owner, name, _ in params:  # from now on these are views set before each forward
            del owner._parameters[name]
        self.full: torch.Tensor | None = None  # gathered vector while alive
        self.prefetched: tuple[torch.Tensor, dist.Work] | None = None
        self.backward_full: torch.Tensor | None = None  # re-gathered for backward (FULL_SHARD)

    # -- communication ------------------------------------------------------------------------
    def _compute(self, shard: torch.Tensor) -> torch.Tensor:
        """The shard as the forward computes with it: cast to the compute dtype (the fp32 master
        shard stays what the optimiser updates)."""
        if self.compute_dtype is None or shard.dtype == self.compute_dtype:
            return shard
        return shard.to(self.compute_dtype)

    def gather(self, shard: torch.Tensor, *, master: bool = False) -> torch.Tensor:
        """The full vector: the prefetched one if a prefetch is in flight, else gathered now;
        in the compute dtype, or in the master (fp32) dtype with ``master``."""
        g = self.groups
        shard = shard if master else self._compute(shard)
        if g.shard_size == 1:
            return shard.view_as(shard)
        if self.prefetched is not None:
            full, work = self.prefetched
            self.prefetched = None
            with record_function("fsdp:wait_all_gather"):
                work.wait()
            return full
        full = torch.empty(self.padded, dtype=shard.dtype, device=shard.device)
        self.stats.add(full)
        with record_function("fsdp:wait_all_gather"):
            _all_gather(full, shard.contiguous(), group=g.shard)
        return full

    def prefetch(self) -> None:
        """Start gathering this unit's parameters now, to be picked up by its next gather."""
        if self.groups.shard_size == 1 or self.prefetched is not None:
            return
        shard = self._compute(self.shard.detach())
        full = torch.empty(self.padded, dtype=shard.dtype, device=shard.device)
        self.stats.add(full)
        work = _all_gather(full, shard.contiguous(), group=self.groups.shard, async_op=True)
        self.prefetched = (full, work)

    def reduce_grad(self, grad_full: torch.Tensor) -> torch.Tensor:
        """Average the full gradient over all ranks and keep this rank's shard of it;
        ``grad_full`` is a fresh buffer of the caller's, consumed here."""
        g = self.groups
        if g.shard_size == 1:
            grad = grad_full  # the shard is the whole vector: reduce in place
        else:
            grad = torch.empty(
                self.padded // g.shard_size, dtype=grad_full.dtype, device=grad_full.device
            )
            self.stats.add(grad_full)
            with record_function("fsdp:wait_reduce_scatter"):
                _reduce_scatter(grad, grad_full, op=dist.ReduceOp.SUM, group=g.shard)
        if g.n // g.shard_size > 1:
            self.stats.add(grad)
            with record_function("fsdp:wait_all_reduce"):
                dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=g.replicate)
        # reduced in the compute dtype (as FSDP's reduce_dtype = param_dtype), kept in fp32
        return grad.to(self.shard.dtype).div_(g.n)

    # -- forward / backward plumbing ----------------------------------------------------------
    def set_views(self, views: tuple[torch.Tensor, ...]) -> None:
        for (owner, name, _, _), view in zip(self.slots, views, strict=True):
            setattr(owner, name, view)

    def clear_views(self) -> None:
        for owner, name, _, _ in self.slots:
            setattr(owner, name, None)

    def pack(self, t: torch.Tensor):
        """Saved-tensor hook (FULL_SHARD): a view of the gathered vector is saved as its
        position only, so the vector can be freed after forward."""
        full = self.full
        if full is not None and t.untyped_storage().data_ptr() == full.untyped_storage().data_ptr():
            return (self, t.storage_offset(), t.shape, t.stride())
        return t

    @staticmethod
    def unpack(packed):
        if not isinstance(packed, tuple):
            return packed
        unit, offset, shape, stride = packed
        if unit.backward_full is None:  # first use in backward: gather once more
            unit.backward_full = unit.gather(unit.shard.detach())
        return unit.backward_full.as_strided(shape, stride, offset)


class _Gather(torch.autograd.Function):
    """shard -> every parameter of the unit, as views of the gathered vector; backward: the
    parameters' gradients, laid out as the vector -> the averaged shard gradient.

    One output per parameter (rather than the vector, sliced afterwards) so that backward
    receives each gradient alone: slicing the vector would make autograd build a zero-filled
    vector-sized gradient per parameter and add them up."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, unit: _Unit) -> tuple[torch.Tensor, ...]:
        ctx.unit = unit
        unit.full = full = unit.gather(shard)
        return tuple(full[off : off + shape.numel()].view(shape) for _, _, off, shape in unit.slots)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None):
        unit = ctx.unit
        # Every use of the parameters in backward is done: free the gathered copies.
        unit.backward_full = unit.full = None
        unit.clear_views()
        like = next(g for g in grads if g is not None)
        # zeros: the padding, a parameter this step did not use; added: a tied parameter's
        # slots share one slice, which takes the sum of its uses' gradients
        grad_full = torch.zeros(unit.padded, dtype=like.dtype, device=like.device)
        for (_, _, off, shape), g in zip(unit.slots, grads, strict=True):
            if g is not None:
                grad_full[off : off + shape.numel()].add_(g.reshape(-1))
        return unit.reduce_grad(grad_full), None


def _refuse_checkpointed(units: list[nn.Module]) -> None:
    """Backward gathers a unit's parameters again through saved-tensor hooks; activation
    checkpointing replaces saved tensors with a recomputation that bypasses the unit's gather,
    so the two do not compose (yet)."""
    if any(getattr(u, "activation_checkpointed", False) for u in units):
        raise ValueError("activation checkpointing is not supported by the reference FSDP yet")


class ReferenceFSDP(nn.Module):
    """Sharded data parallel wrapper (see the module docstring); ``units`` are submodules of
    ``module`` that each get a flat parameter, the root gets the rest."""

    def __init__(
        self,
        module: nn.Module,
        units: list[nn.Module],
        *,
        strategy: str = "FULL_SHARD",
        group: dist.ProcessGroup | None = None,
        shard_size: int | None = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        _refuse_checkpointed(units)
        super().__init__()
        self.compute_dtype = compute_dtype
        if strategy not in STRATEGIES:
            raise ValueError(
                f"unknown sharding strategy {strategy!r} (known: {', '.join(STRATEGIES)})"
            )
        self.module, self.strategy = module, strategy
        self.comm_stats = CommStats()
        self.groups = _make_groups(group, strategy, shard_size)
        self._broadcast(group)
        self.units: list[_Unit] = []
        # Frozen parameters stay whole on every rank, outside the flat parameters: a trainable
        # shard would give them a gradient and AdamW's weight decay (they would train).
        for m, params in unit_params(module, units, frozen=False):
            unit = _Unit(m, params, self.groups, strategy, self.comm_stats, compute_dtype)
            self.units.append(unit)
            m.register_forward_pre_hook(self._pre_forward(unit))
            m.register_forward_hook(self._post_forward(unit))
        # the trainable shards, registered so .parameters() and optimisers see them
        self.shards = nn.ParameterList([u.shard for u in self.units])
        self._hooks: dict[int, torch.autograd.graph.saved_tensors_hooks] = {}
        # Units in the order their forwards start, recorded in the first step, so that each
        # unit's forward can prefetch the next one's parameters (the same order on every rank).
        self._order: list[_Unit] = []
        self._recording = True

    @torch.no_grad()
    def _broadcast(self, group) -> None:
        for t in [*self.module.parameters(), *self.module.buffers()]:
            dist.broadcast(t, group_src=0, group=group)

    def _pre_forward(self, unit: _Unit):
        def hook(_module, args):
            unit.set_views(_Gather.apply(unit.shard, unit))
            if self._recording:
                if unit in self._order:  # the second step begins: the order is known
                    self._recording = False
                else:
                    self._order.append(unit)
            if not self._recording:
                k = self._order.index(unit)
                if k + 1 < len(self._order):
                    self._order[k + 1].prefetch()
            if self.strategy in ("FULL_SHARD", "HYBRID_SHARD"):
                ctx = torch.autograd.graph.saved_tensors_hooks(unit.pack, _Unit.unpack)
                ctx.__enter__()
                self._hooks[id(unit)] = ctx
            if self.compute_dtype is not None:  # inputs in the parameters' dtype, as FSDP does
                return tuple(
                    a.to(self.compute_dtype) if torch.is_tensor(a) and a.is_floating_point() else a
                    for a in args
                )
            return None

        return hook

    def _post_forward(self, unit: _Unit):
        def hook(_module, _args, output):
            ctx = self._hooks.pop(id(unit), None)
            if ctx is not None:  # free the gathered parameters until backward needs them
                ctx.__exit__(None, None, None)
                unit.clear_views()
                unit.full = None
            return output

        return hook

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def full_parameters(self) -> list[torch.Tensor]:
        """Every unit's full flat vector, gathered (a collective): what replicas must agree on."""
        return [u.gather(u.shard.detach(), master=True)[: u.numel].clone() for u in self.units]

    @torch.no_grad()
    def full_state_dict(self, rank0_only: bool = True) -> dict[str, torch.Tensor]:
        """The plain model's state dict, gathered (a collective on every rank); on ranks other
        than 0 it is empty when ``rank0_only``. Loads into the unwrapped model class."""
        names = {}
        for prefix, owner in self.module.named_modules():
            names[id(owner)] = f"{prefix}." if prefix else ""
        state = {}
        for unit, full in zip(self.units, self.full_parameters(), strict=True):
            for owner, name, off, shape in unit.slots:
                state[names[id(owner)] + name] = full[off : off + shape.numel()].view(shape).clone()
        for prefix, buf in self.module.named_buffers():
            state[prefix] = buf.detach().clone()
        if rank0_only and dist.get_rank(self.groups.world) != 0:
            return {}
        return state

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the shard gradients so that the norm of the whole model's gradient is at most
        ``max_norm``; returns that norm. Shards are disjoint inside a shard group and equal
        across replicas, so the squares are summed over the shard group only."""
        grads = [u.shard.grad for u in self.units if u.shard.grad is not None]
        sq = (
            torch.stack([g.float().pow(2).sum() for g in grads]).sum() if grads else torch.zeros(())
        )
        if self.groups.shard_size > 1:
            dist.all_reduce(sq, group=self.groups.shard)
        total = sq.sqrt()
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.to(g.dtype))
        return total

    def held_bytes(self) -> int:
        """Bytes of parameters this rank holds right now: its shards, plus every gathered
        vector still alive (between forward and backward that is what tells the strategies
        apart)."""
        gathered = sum(
            u.full.numel() * u.full.element_size()
            for u in self.units
            if u.full is not None and u.groups.shard_size > 1
        )
        return self.sharded_bytes() + gathered

    def sharded_bytes(self) -> int:
        """Bytes of parameters this rank holds at rest (its shards)."""
        return sum(u.shard.numel() * u.shard.element_size() for u in self.units)
