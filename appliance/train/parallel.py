"""Data-parallel training: the process that owns the run (the lead, rank 0) and helpers, one torch process group.

The lead alone holds the store, and so it alone records epochs, stores checkpoints and models, and decides when to
stop (Group.agree passes its decisions to every rank). Helpers only compute, and write nothing: what they need (the
run's plan and parameters, a checkpoint to resume from) the lead shares over the group. On one box (helpers())
the lead is the job's own process and the helpers are spawned processes, given the dataset through a pipe, never
a file; on a Ray cluster, Ray Train starts every rank and joins the group (operations/burst_remote.py).
Gradients are averaged across ranks by DistributedDataParallel; gloo carries them between CPU processes, NCCL
between GPUs.
"""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from appliance.core.errors import JobError

PEER_TIMEOUT_S = 300  # a rank that waits this long on the others gives up (one that dies is noticed at once)
HELPER_EXIT_S = 30.0


@dataclass(frozen=True)
class Group:
    """This process's place among the ranks training one run."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0  # among the ranks on this machine: which of its GPUs is this rank's

    @property
    def leads(self) -> bool:
        """Whether this rank keeps the run's records (the others only compute)."""
        return self.rank == 0

    def share(self, value: Any) -> Any:
        """The lead's value on every rank (what the others pass is ignored)."""
        if self.size == 1:
            return value
        shared: list[Any] = [value]
        dist.broadcast_object_list(shared, src=0)
        return shared[0]

    def agree(self, *decisions: bool) -> tuple[bool, ...]:
        """The lead's decisions (stop, budget spent, ...) on every rank, so all leave a loop together."""
        return tuple(self.share(decisions))

    def gather(self, part: Any) -> list[Any]:
        """Every rank's part, in rank order, on every rank."""
        if self.size == 1:
            return [part]
        parts: list[Any] = [None] * self.size
        dist.all_gather_object(parts, part)
        return parts

    def device(self, planned: str) -> torch.device:
        """This rank's device: the planned one on a CPU; on GPUs, its local rank's place after the planned one."""
        device = torch.device(planned)
        if device.type != "cuda":
            return device
        return torch.device("cuda", (device.index or 0) + self.local_rank)


SOLO = Group()

Helper = Callable[..., None]  # called as helper(group, *payload) in each helper process


@contextmanager
def helpers(size: int, planned_device: str, helper: Helper, payload: tuple[Any, ...]) -> Iterator[Group]:
    """Start size-1 helper processes running helper(group, *payload) and join them in a process group; yields
    this process's Group (rank 0). On the way out the group is left and the helpers ended."""
    port = _free_port()
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: torch's threads do not survive a fork
    started = [context.Process(target=_help, args=(rank, size, port, planned_device, helper, payload), daemon=True,
                               name=f"train-rank-{rank}") for rank in range(1, size)]
    for process in started:
        process.start()
    try:
        group = _join(0, size, port, planned_device)
        try:
            yield group
        except RuntimeError as exc:  # what a collective raises when a peer has gone
            gone = [process for process in started if process.exitcode is not None]
            if not gone:
                raise
            code = gone[0].exitcode or 0
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            raise JobError(f"a data-parallel worker stopped: {gone[0].name} {how}",
                           hint="the job's log holds its error; run again with --workers 1 to train in one"
                                " process") from exc
        finally:
            dist.destroy_process_group()
    finally:
        for process in started:
            process.join(HELPER_EXIT_S)
            if process.is_alive():
                process.kill()


def _help(rank: int, size: int, port: int, planned_device: str, helper: Helper, payload: tuple[Any, ...]) -> None:
    group = _join(rank, size, port, planned_device)
    try:
        helper(group, *payload)
    finally:
        dist.destroy_process_group()


def _join(rank: int, size: int, port: int, planned_device: str) -> Group:
    group = Group(rank, size, local_rank=rank)
    device = group.device(planned_device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=size, timeout=timedelta(seconds=PEER_TIMEOUT_S))
    return group


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
