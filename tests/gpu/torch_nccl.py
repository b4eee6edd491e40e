"""NCCL between two processes of one guest, each on its own GPU: torch.distributed all_reduce
(sum) and all_gather of fixed tensors, a broadcast, and a reduce_scatter; prints, per rank, the
results' checksums (run natively and through vmgpu on a host with two GPUs; the outputs must be
equal and correct)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    n = 1 << 20
    x = torch.arange(n, device="cuda", dtype=torch.float32) * (rank + 1)
    dist.all_reduce(x)
    expect = torch.arange(n, device="cuda", dtype=torch.float32) * 3
    gathered = [torch.empty(1000, device="cuda") for _ in range(2)]
    dist.all_gather(gathered, torch.full((1000,), float(rank + 7), device="cuda"))
    b = torch.full((4096,), float(rank), device="cuda")
    dist.broadcast(b, src=1)
    rs = torch.empty(512, device="cuda")
    dist.reduce_scatter_tensor(rs, torch.ones(1024, device="cuda") * (rank + 1))
    torch.cuda.synchronize()
    lines = [
        f"rank {rank} all_reduce correct={torch.equal(x, expect)} sum={x.double().sum().item():.6e}",
        f"rank {rank} all_gather {[g[0].item() for g in gathered]}",
        f"rank {rank} broadcast {b.sum().item()}",
        f"rank {rank} reduce_scatter {rs.sum().item()}",
    ]
    print("\n".join(lines), flush=True)
    dist.destroy_process_group()


def main() -> None:
    if torch.cuda.device_count() < 2:
        sys.exit(f"torch_nccl.py needs two GPUs; this process sees {torch.cuda.device_count()}")
    port = 29500 + os.getpid() % 1000
    # ranks print in turn: rank 0's lines, then rank 1's (the output is compared as a whole)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, port)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        sys.exit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")


if __name__ == "__main__":
    main()
