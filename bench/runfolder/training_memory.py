"""The training table's columns around a point's peak memory (results.csv, in their place in
``training_columns.py``): what the allocator reserved, what stayed in use once the point was
released, and of that what is the point's own (bench/runner/measure/peak_memory.py's
``own_memory``)."""

from __future__ import annotations

from bench.runfolder.column import MAX, Column

RELEASED: tuple[Column, ...] = (
    Column(
        name="peak_reserved_mb",
        unit="MiB",
        ranks=MAX,
        meaning="CUDA: most memory the caching allocator held "
        "in the measured step, above the point's start (fragmentation included; NaN on CPU)",
    ),
    Column(
        name="mem_left_mb",
        unit="MiB",
        ranks=MAX,
        meaning="memory still in use once the point was released, above its start (caches it "
        "filled, or a leak): not in peak_mem_mb but for mem_kept_mb",
    ),
    Column(
        name="mem_kept_mb",
        unit="MiB",
        ranks=MAX,
        meaning="of mem_left_mb, the point's own parameters, gradients and optimiser state "
        "still alive once it was released (the implementation's leak): in peak_mem_mb",
    ),
)
