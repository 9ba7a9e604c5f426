"""Tensor, context, sequence and hybrid-sharded data parallelism (accelerate ``ParallelismConfig``), per rank.

Public surface: :func:`rank_local_spec` (the step one rank runs, as a plain data-parallel spec),
:func:`parallel_components` / :func:`parallel_findings` (CP ring and Ulysses all-to-all buffers, notes),
:func:`layout_problems` (accelerate's own checks), :func:`describe_layout`.
"""

from fitcheck.core.parallelism.buffers import parallel_components, parallel_findings
from fitcheck.core.parallelism.comm import parallel_comm_bytes
from fitcheck.core.parallelism.layout import layout_problems, size_problems
from fitcheck.core.parallelism.local import active_layout, describe_layout, rank_local_spec, shard_group

__all__ = [
    "active_layout",
    "describe_layout",
    "layout_problems",
    "parallel_comm_bytes",
    "parallel_components",
    "parallel_findings",
    "rank_local_spec",
    "shard_group",
    "size_problems",
]
