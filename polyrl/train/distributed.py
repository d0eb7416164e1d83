"""Data-parallel training over torch.distributed: one update split across processes.

Every rank holds the whole step's batch (rank 0 gathers the rollouts and `broadcast`s
them) and draws the same minibatch order (update.py's seeded generator). Each minibatch's
rows are dealt to the ranks by length, and each rank's loss is its rows' token sums
divided by the count of the WHOLE minibatch (an all-reduce of the ranks' counts), so the
ranks' losses add up to the one-process loss and their gradients add up to its gradient.
FSDP averages gradients over ranks, so `backward` scales each rank's
loss by the world size: the averaged gradient is then exactly the sum. One process and
N processes thus take the same optimizer step, up to float rounding (tests/test_distributed.py,
2 processes on CPU with gloo, to 1e-5).

The policy is sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`): each decoder
layer its own unit, the embeddings, final norm and (tied) lm_head in the root unit.
FSDP gathers a unit's parameters at every forward call and reduces gradients at every
backward, so all ranks must make the same sequence of calls. Hence two rules the update
follows when world_size > 1:
- one module call per pass: no shared-prefix pass (train/packing.py's prefix pass is a
  second call, made only by ranks whose rows have a prefix); rows run padded;
- the same number of passes everywhere: a rank with fewer pieces (or no rows) runs
  `idle_passes` (a one-token forward whose backward adds zero gradients).
Gradients are reduce-scattered at each backward (no accumulation of unsharded gradients,
so memory stays sharded). Mixed precision is bf16 autocast (device.py), as in one process;
FSDP2's MixedPrecisionPolicy (bf16 all-gathers) would halve the traffic, untried.

Launching. The process group comes from the environment that torchrun and Ray set:
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (`init_from_env`). Backend gloo on
CPU, nccl on CUDA (device cuda:LOCAL_RANK).
- One machine, N GPUs: `polyrl train RUN --nproc N`, or `torchrun --nproc-per-node N -m
  polyrl.cli train RUN`: every process runs the same command, rank 0 also runs the rollout
  engine and writes the run dir, and the others follow its collectives (train/ranks.py).
- Ray: N trainer actors (one GPU each, in a placement group); the driver picks rank 0's
  node address and a free port, and each actor sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_*
  in os.environ before calling `init_from_env` (what ray.train's TorchTrainer does too).
  WORLD_SIZE unset or 1 gives `SingleProcess`: no process group, nothing sharded.

Weight sync to the engine. The interface stays `engine.update_weights(state_dict, version)`.
`engine_weights` is a collective: every rank calls it, rank 0 gets the full state dict
on the host (the shards all-gathered, then copied to CPU) and the others an empty dict;
rank 0 alone calls update_weights. This is the CPU path (object store for a Ray engine).
On GPUs the same call site can be served without the host copy:
- NCCL broadcast: the engine's workers join a process group with the trainer's rank 0
  (vLLM: a weight-transfer group via collective_rpc); rank 0 broadcasts each full
  tensor by name from GPU memory, and update_weights on such an engine carries only the
  names, shapes and version (the tensors arrive on the side channel);
- CUDA IPC, trainer and engine on the same GPU: rank 0 sends IPC handles of the gathered
  tensors (torch.multiprocessing.reductions.reduce_tensor), the engine maps them and
  copies in place.
Neither is implemented: they need a GPU to write and test against.

Untested here (no GPU on the development machine): nccl, CUDA devices, bf16 autocast
under FSDP, multi-node rendezvous, and the two GPU weight paths above. Tested on CPU with
gloo: the row split and normalisation, idle passes, FSDP2 sharding with tied weights,
engine_weights and load_full_state_dict.
Out of scope: tensor/pipeline parallelism, sharded checkpoint files (checkpoints are
gathered to rank 0 and written in Hugging Face format as in one process).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from polyrl.models.transformer import DecoderLayer
from polyrl.train.device import autocast, host_state_dict, resolve_device

ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class SingleProcess:
    """One process: nothing split, nothing communicated, nothing wrapped."""

    rank, world_size = 0, 1
    prefix_pass = True
    """whether the update may run a group's shared prefix as a pass of its own (packing.py)"""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device or torch.device("cpu")

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model on this process's device (in place)."""
        return model.to(self.device)

    def my_rows(self, rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return rows

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def gather(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        return obj

    def barrier(self) -> None:
        pass

    def idle_passes(self, done: int) -> int:
        """The empty passes to add to `done` real ones: none (see DataParallel)."""
        return 0

    def idle_pass(self, model: torch.nn.Module, backward: bool) -> None:
        """Never needed in one process (idle_passes is 0)."""

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_grad_norm_(self, model: torch.nn.Module, max_norm: float) -> float:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()

    def engine_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return host_state_dict(model)

    def load_full_state_dict(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        model.load_state_dict(state)

    def close(self) -> None:
        pass


class DataParallel(SingleProcess):
    """This process's part of a data-parallel group (see the module docstring)."""

    prefix_pass = False  # FSDP: every rank makes the same module calls, one per pass

    def __init__(self, rank: int, world_size: int, device: torch.device) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        assert dist.is_initialized() and dist.get_world_size() == world_size and dist.get_rank() == rank
        self.rank, self.world_size, self.device = rank, world_size, device
        self.mesh = init_device_mesh(device.type, (world_size,))

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Shard the model in place with FSDP2 (each DecoderLayer a unit, the rest the root).
        Build the optimizer after this: its parameters become DTensor shards. `model.hidden`
        is registered as a forward method, so calls to it gather parameters too."""
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

        model.to(self.device)
        for layer in [m for m in model.modules() if isinstance(m, DecoderLayer)]:
            fully_shard(layer, mesh=self.mesh)
        fully_shard(model, mesh=self.mesh)
        if hasattr(model, "hidden"):
            register_fsdp_forward_method(model, "hidden")
        return model

    def my_rows(self, rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """This rank's share of rows: dealt longest first, so ranks get similar token counts."""
        by_length = rows[lengths[rows].argsort(descending=True, stable=True)]
        return by_length[self.rank::self.world_size].sort().values

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """t summed over ranks (on t's device, whatever the backend needs)."""
        x = t.detach().to(self.device, copy=True)
        dist.all_reduce(x)
        return x.to(t.device)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's obj (picklable), in rank order, on every rank."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        """Wait until every rank is here."""
        dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's obj on every rank (the others pass anything, e.g. None)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def idle_passes(self, done: int) -> int:
        """How many empty passes this rank must add to the `done` it will make so that all
        ranks make as many (an all-reduce: call it before the passes, on every rank); the
        caller runs them with `idle_pass`."""
        n = torch.tensor([done], device=self.device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        return int(n) - done

    def idle_pass(self, model: torch.nn.Module, backward: bool) -> None:
        """A one-token forward (and backward of 0 * its output): the same FSDP collectives
        as a real pass, zero gradients."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        with torch.set_grad_enabled(backward), autocast(self.device):
            out = model(ids)
        if backward:
            self.backward(out.sum() * 0.0)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of world_size * loss: FSDP averages gradients over ranks, and the sum
        of the ranks' gradients is the one-process gradient."""
        (loss * self.world_size).backward()

    def clip_grad_norm_(self, model: torch.nn.Module, max_norm: float) -> float:
        """Clip by the norm of the whole (unsharded) gradient; returns that norm."""
        from torch.distributed.tensor import DTensor

        params = [p for p in model.parameters() if p.grad is not None]
        total = torch.nn.utils.get_total_norm([p.grad for p in params])
        if isinstance(total, DTensor):
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total.item()

    def engine_weights(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict on the host on rank 0, {} elsewhere. A collective: every rank
        calls it. One tensor is gathered at a time (device memory holds one full tensor more
        than the shards), once per distinct tensor: tied names share it, as in the model."""
        from torch.distributed.tensor import DTensor

        full: dict[int, torch.Tensor] = {}
        out = {}
        for name, t in model.state_dict().items():
            local = t.to_local() if isinstance(t, DTensor) else t
            if local.data_ptr() not in full:
                whole = t.full_tensor() if isinstance(t, DTensor) else t
                full[local.data_ptr()] = whole.detach().to("cpu") if self.rank == 0 else whole[:0]
            out[name] = full[local.data_ptr()]
        return out if self.rank == 0 else {}

    def load_full_state_dict(self, model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load a full (unsharded) state dict given on rank 0 into the sharded model (resume).
        A collective; the other ranks pass {}."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        # A copy: set_model_state_dict puts the shards it makes into the dict it is given.
        set_model_state_dict(model, dict(state),
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


ONE_PROCESS = SingleProcess()
"""update()'s default: one process, tensors on the policy's own device."""


def init_from_env(device: str = "auto") -> SingleProcess | DataParallel:
    """The data-parallel group this process belongs to, from the environment torchrun and Ray
    set (see the module docstring); SingleProcess when WORLD_SIZE is unset or 1.

    device: trainer.device (auto | cpu | cuda); on CUDA each process takes cuda:LOCAL_RANK."""
    dev = resolve_device(device)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return SingleProcess(dev)
    missing = [k for k in ENV if k not in os.environ]
    if missing:
        raise RuntimeError(f"WORLD_SIZE={world_size} but {', '.join(missing)} not set: launch with torchrun, or "
                           f"set {', '.join(ENV)} (and LOCAL_RANK) in each process before init_from_env")
    rank, dev = join_process_group(world_size, dev)
    return DataParallel(rank, world_size, dev)


def join_process_group(world_size: int, dev: torch.device) -> tuple[int, torch.device]:
    """This process's rank and device in the default process group of torchrun's environment
    (RANK set), joined once: gloo on CPU, nccl on cuda:LOCAL_RANK."""
    rank = int(os.environ["RANK"])
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=rank, world_size=world_size,
                                device_id=dev if dev.type == "cuda" else None)
    return rank, dev
