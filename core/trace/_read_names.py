"""The event names the GPU timeline and the recomputation finder read, apart from them.

`_kineto` and `_recompute` read these names; `_select` leaves out, before decoding, the events
that hold none of them. They live here, in a module without numpy, so that `mfuscope analyze`
can select the events of its first trace while numpy and the engine still load on another
thread (`mfuscope.cli.analyze`).
"""

from __future__ import annotations

__all__ = [
    "COMM_KERNEL_SUBSTRINGS",
    "ENGINE_PREFIX",
    "PYTHON_FUNCTION",
    "RECOMPUTE_OPERATOR_PREFIXES",
    "RECOMPUTE_PYTHON_SUBSTRINGS",
    "RECORD_PARAM_COMMS",
    "REENTRANT_OP",
    "TIMELINE_OPERATOR_PREFIXES",
]

# A kernel is communication only if its lower-cased name holds one of these (and its family
# says so: `kernel_classes.is_communication_kernel`). One for each way a communication family
# of `_kernel_families` can be spelled, camelCase folded: NCCL / RCCL / MSCCL (and NCCL's
# one-rank reduction), collectives (PyTorch symmetric memory, custom all-reduce of vLLM /
# SGLang / TensorRT-LLM, NVSHMEM's on-stream collectives), NVSHMEM / rocSHMEM, DeepEP, pplx,
# Transformer Engine userbuffers.
COMM_KERNEL_SUBSTRINGS = (
    "nccl",
    "rccl",
    "msccl",
    "onerankreduce",
    "allreduce",
    "all_reduce",
    "allgather",
    "all_gather",
    "reducescatter",
    "reduce_scatter",
    "alltoall",
    "all_to_all",
    "all2all",
    "cross_device_reduce",
    "crossdevicereduce",
    "multigpubarrier",
    "multi_gpu_barrier",
    "nvshmem",
    "rocshmem",
    "userbuffers",
    "on_stream",
    "onstream",
    "deep_ep",
    "pplx",
    "symmetric_memory",
    "intra_node_comm",
)
RECORD_PARAM_COMMS = "record_param_comms"
TIMELINE_OPERATOR_PREFIXES = (RECORD_PARAM_COMMS,)  # the operators a GPU timeline reads

# Recomputation (`_recompute`): the reentrant checkpoint's operator, the engine ranges nested
# in it, and the Python function non-reentrant checkpointing re-runs the forward in.
REENTRANT_OP = "CheckpointFunctionBackward"
ENGINE_PREFIX = "autograd::engine::evaluate_function:"
PYTHON_FUNCTION = "): recompute_fn"
RECOMPUTE_OPERATOR_PREFIXES = (REENTRANT_OP, ENGINE_PREFIX)
RECOMPUTE_PYTHON_SUBSTRINGS = (PYTHON_FUNCTION,)
