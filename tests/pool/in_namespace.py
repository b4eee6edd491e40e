"""Run inside a lab namespace by the pool's tests (it reaches etcd only from there); prints one
JSON object.

    race URL N MEM   N threads, released together, each admit a guest racer-I to one slice
    stale URL        a transaction on a GPU read before another admission changed it
"""

from __future__ import annotations

import json
import sys
import threading

from vmgpu.errors import VmgpuError
from vmgpu.pool import admission
from vmgpu.pool.store import GPUS, Store


def race(url: str, n: int, mem: str) -> dict:
    start = threading.Barrier(n)
    results: dict[str, str] = {}

    def one(i: int) -> None:
        store = Store(url)  # one client per thread
        start.wait()
        try:
            grant = admission.admit(store, f"racer-{i}", admission.request(1, mem, 10))
            results[f"racer-{i}"] = "admitted " + grant.slices[0].uuid
        except VmgpuError as e:
            results[f"racer-{i}"] = e.code

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def stale(url: str) -> dict:
    store = Store(url)
    before, _ = store.range(GPUS)
    grant = admission.admit(store, "stale-other", admission.request(1, "1G", 1))
    read = next(e for e in before if e.key.endswith(grant.slices[0].uuid))
    # what an admission that read `before` would write: refused, the GPU changed since
    applied = store.txn([Store.unchanged(read)], [Store.put(read.key, read.json(), lease=read.lease)])
    after = store.get(read.key).json()
    admission.release(store, "stale-other")
    return {"applied": applied, "free_after": after["mem_free_mib"], "free_before": read.json()["mem_free_mib"]}


if __name__ == "__main__":
    mode, url = sys.argv[1], sys.argv[2]
    out = race(url, int(sys.argv[3]), sys.argv[4]) if mode == "race" else stale(url)
    print(json.dumps(out))
