"""Several processes (``torchrun`` / ``accelerate launch``): who am I, which rows are mine, and putting the
pieces back together in order.

Everything here is a no-op in a single process. Collectives go through ``torch.distributed`` (which
``accelerate`` also uses); under the NCCL backend tensors travel through the process's CUDA device and
come back on the CPU. Uneven pieces (a last shard one row shorter) are padded to the longest piece for
the collective and trimmed afterwards, so no row is ever duplicated or dropped.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import Any

import torch

__all__ = [
    "accelerate_disagrees",
    "even_batches_padding",
    "all_gather_object",
    "all_gather_rows",
    "all_reduce_sum",
    "init_from_environment",
    "is_distributed",
    "rank_and_world_size",
    "shard_range",
]

logger = logging.getLogger(__name__)


def is_distributed() -> bool:
    """True inside an initialised process group of more than one process."""
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def rank_and_world_size() -> tuple[int, int]:
    if is_distributed():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def init_from_environment() -> bool:
    """Join the process group that ``torchrun`` / ``accelerate launch`` describe in the environment, if not done yet.

    NCCL on GPUs (each process on its ``LOCAL_RANK`` device), gloo on CPUs, as accelerate's multi-GPU
    launch does; the group is destroyed at exit. (``accelerate.PartialState`` is not used: on a CPU-only
    ``torchrun`` it reports a single process while joining a group of several.) Returns
    ``is_distributed()``; a plain ``python`` run (no ``WORLD_SIZE`` > 1) stays a single process.
    """
    if is_distributed() or int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not torch.distributed.is_available():
        return is_distributed()
    if not torch.distributed.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.distributed.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(_destroy)
        logger.info("joined a process group of %d processes", torch.distributed.get_world_size())
    return is_distributed()


def _destroy() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def accelerate_disagrees() -> str | None:
    """Why accelerate's view of the processes contradicts torch.distributed's, or None.

    On CPU-only machines accelerate (1.15) can report one process while ``torch.distributed`` holds several
    (``accelerate launch --multi_gpu`` / ``torchrun`` without ``cpu=True``): a DataLoader it prepared is then
    not sharded, every process sees all the data, and summing over processes would count it several times.
    Only consulted when accelerate's state already exists; never creates it.
    """
    state_module = sys.modules.get("accelerate.state")
    if state_module is None or not is_distributed() or not getattr(state_module.PartialState, "_shared_state", None):
        return None
    accelerate_processes = state_module.PartialState().num_processes
    world = torch.distributed.get_world_size()
    if accelerate_processes == world:
        return None
    return (
        f"accelerate reports {accelerate_processes} process(es) but torch.distributed holds {world}: a DataLoader "
        "prepared by that Accelerator was not split between the processes"
    )


def even_batches_padding(n: int) -> int | None:
    """How many of the last ``n`` rows of this process's current batch are accelerate's ``even_batches`` padding.

    Under ``even_batches=True`` (accelerate's default) a prepared DataLoader completes the last round of batches with
    samples from the start of the dataset, so that every process gets a full batch. Like
    ``Accelerator.gather_for_metrics``, the true rows are read off the ``GradientState``: on the last batch
    (``end_of_dataloader``), ``remainder`` = dataset length mod the batch size over all processes, and the rows
    gathered in rank order are true up to ``remainder``, so process ``r``'s ``n``-row batch holds
    ``min(n, max(0, remainder - r n))`` true rows. Returns 0 when nothing is padded (no accelerate state, not the last
    batch, ``even_batches=False``, no remainder, or this process's last batch holds true rows only, so that whatever
    rows are fed, slices of that batch included, none is a repeat), None when padding may be there but cannot be
    located (a dataset without a length, or rows of another size than the loader's batch on a process whose batch is
    padded). Only consulted when accelerate's state already exists; never creates it.
    """
    state_module = sys.modules.get("accelerate.state")
    if state_module is None or not getattr(state_module.GradientState, "_shared_state", None):
        return 0
    gradient_state = state_module.GradientState()
    if not gradient_state.in_dataloader or not gradient_state.end_of_dataloader:
        return 0
    loader = gradient_state.active_dataloader
    sampler = getattr(loader, "batch_sampler", None)
    if not getattr(sampler, "even_batches", getattr(loader, "even_batches", False)):
        return 0
    state = state_module.PartialState()
    if state.num_processes <= 1:
        return 0
    remainder = gradient_state.remainder
    if remainder == 0:
        return 0
    per_process = getattr(loader, "total_batch_size", 0) // state.num_processes
    if remainder < 0 or per_process <= 0:
        return None
    true = min(per_process, max(0, remainder - state.process_index * per_process))
    if true == per_process:  # this process got no repeats: nothing to drop, whatever rows are fed (slices included)
        return 0
    if n != per_process:
        return None
    return n - true


def shard_range(n: int, rank: int, world_size: int) -> range:
    """Rows ``[start, stop)`` of process ``rank``: contiguous pieces in rank order whose lengths differ by at most one."""
    q, r = divmod(n, world_size)
    start = rank * q + min(rank, r)
    return range(start, start + q + (rank < r))


def _device() -> torch.device:
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every process's ``tensor`` along dim 0, in rank order; the pieces may differ in length.

    Returns a CPU tensor on every process. In a single process, returns ``tensor`` itself.
    """
    if not is_distributed():
        return tensor
    device = _device()
    world = torch.distributed.get_world_size()
    length = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=device)
    lengths = [torch.empty_like(length) for _ in range(world)]
    torch.distributed.all_gather(lengths, length)
    lengths = [int(x.item()) for x in lengths]
    longest = max(lengths)
    padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=device)
    padded[: tensor.shape[0]] = tensor.to(device)
    pieces = [torch.empty_like(padded) for _ in range(world)]
    torch.distributed.all_gather(pieces, padded)
    return torch.cat([piece[:size] for piece, size in zip(pieces, lengths)]).cpu()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum of ``tensor`` over all processes, as a new CPU tensor (``tensor`` itself in a single process)."""
    if not is_distributed():
        return tensor
    total = tensor.to(_device(), copy=True)
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)
    return total.cpu()


def all_gather_object(obj: Any) -> list[Any]:
    """Every process's (picklable) ``obj``, in rank order (``[obj]`` in a single process)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out
