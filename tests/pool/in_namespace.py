"""Run inside a lab namespace by the pool's tests (it reaches etcd only from there); prints one
JSON object.

    race URL N MEM   N threads, released together, each admit a guest racer-I to one slice
    stale URL        a transaction on a GPU read before another admission changed it
    junk URL put|delete   records no vmgpu wrote: a GPU record that is not JSON, one that claims
                     more free memory than it has, a guest record with no token hash
"""

from __future__ import annotations

import json
import sys
import threading

from vmgpu.errors import VmgpuError
from vmgpu.pool import admission
from vmgpu.pool.store import GPUS, GUESTS, Store, _b64


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


JUNK = {
    GPUS + "GPU-junk-1": b"not json {",
    GPUS + "GPU-junk-2": json.dumps(
        {"uuid": "GPU-junk-2", "host": "ha", "index": 9, "name": "x", "mem_mib": 1, "mem_free_mib": 1 << 30}
        | {"compute_free_pct": 100}
    ).encode(),
    GUESTS + "junk": b'{"guest": "junk", "slices": []}',
}


def junk(url: str, what: str) -> dict:
    store = Store(url)
    for key, value in JUNK.items():
        if what == "put":
            store._post("kv/put", {"key": _b64(key), "value": _b64(value)})
        else:
            store.txn([], [Store.delete(key)])
    return {"keys": sorted(JUNK)}


if __name__ == "__main__":
    mode, url = sys.argv[1], sys.argv[2]
    if mode == "race":
        out = race(url, int(sys.argv[3]), sys.argv[4])
    elif mode == "junk":
        out = junk(url, sys.argv[3])
    else:
        out = stale(url)
    print(json.dumps(out))
