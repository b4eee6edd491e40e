"""Graphs built node by node (XLA's command buffers) at the trust boundary, on the simulated backend,
whose graph launch runs the nodes (host_forwarder/sim/graphs_explicit.c).  A node is work the GPU
does later, so what it names is checked when it is added or its parameters set
(host_forwarder/native/graph_nodes.c): memcpy and memset ranges inside the process's own memory,
host memory only pinned memory of its region's heap, a kernel node's function its own and its
parameters laid out as a launch's, every graph, node and dependency handle through its table."""

import struct
import subprocess
import sys

import pytest

from tests.forwarder import NATIVE, ROOT, forwarder, run_guest
from tests.native.test_generator import raw
from vmgpu import shm

pytestmark = pytest.mark.native

OP_MEM_ALLOC = 22
OP_CREATE, OP_EMPTY, OP_KERNEL, OP_MEMCPY, OP_MEMSET = 150, 151, 152, 153, 154
OP_KERNEL_SET, OP_EXEC_KERNEL_SET, OP_NODE_TYPE = 158, 159, 166
INVALID_VALUE, INVALID_HANDLE, NOT_SUPPORTED = 1, 400, 801


def other_process(chan) -> tuple[int, int]:
    """Another guest process's allocation, beyond any address the program below allocates, and one
    of its graph's nodes, beyond any handle the program has (the tables are per process)."""
    allocs = [raw(chan, OP_MEM_ALLOC, struct.pack("<QQ", 1, 4096), seq=1 + i) for i in range(8)]
    assert all(r == 0 for r, _ in allocs), allocs
    graphs = [raw(chan, OP_CREATE, struct.pack("<QI4x", 1, 0), seq=20 + i) for i in range(40)]
    assert all(r == 0 for r, _ in graphs), graphs
    g = struct.unpack_from("<Q", graphs[-1][1])[0]
    r, rep = raw(chan, OP_EMPTY, struct.pack("<QQQQ", 1, g, 0, 0), seq=70)
    assert r == 0, rep
    return struct.unpack_from("<Q", allocs[-1][1])[0], struct.unpack_from("<Q", rep)[0]


def test_a_graph_built_by_hand_runs_and_every_node_is_checked_when_it_is_added(shm_path):
    """tests/cuda/graphs_explicit.c through the guest library, against the ASan/UBSan forwarder: a
    memset node and a copy from pinned memory feed a vadd kernel node whose result a copy brings back
    into pinned memory: right results; the executable graph's kernel node given new parameters: the
    new results; the executable graph updated from another graph of its shape: its results, and from
    one of another shape: refused, its reason the generic one; a node disabled and its flag read back;
    node types; a child graph runs; a launch captured into a graph that exists, after its memset node,
    runs after it (and a capture after another process's node is refused).  Refused when added or set:
    memset and memcpy ranges one byte past an allocation, starting inside it and running past, rows or
    a second row past it, another process's allocation, pinned memory far past the heap
    (CUDA_ERROR_INVALID_VALUE); pageable host memory either way (CUDA_ERROR_NOT_SUPPORTED, said once
    in the guest's log); a forged function, a node or graph not its own (another process's node, a
    stale generation) as a dependency, a target or a child (CUDA_ERROR_INVALID_HANDLE).  A destroyed
    graph's nodes name nothing.  The forwarder stays up."""
    with forwarder(shm_path, size="128M", asan=True) as fwd:
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)
        try:
            other, foreign = other_process(chan)
            r = run_guest(
                [NATIVE / "graphs_explicit", ROOT / "tests" / "cuda" / "vadd.ptx", hex(other), hex(foreign)], shm_path
            )
            assert r.returncode == 0, r.stdout + r.stderr + fwd.log()
            assert r.stdout.splitlines() == [
                "built and launched: 0 0",
                "kernel node updated: 0 0",
                "updated from a graph: 0 0 0",
                "updated from another shape: 910 1",  # CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
                "enabled flag: 0 0 0",
                "node types: 1 2 1 0 1 5",  # memset, memcpy, kernel, memcpy, empty
                "child graph: 0 0",
                "captured into a graph: 0 1 0 400",
                "memset nodes: 1 1 1 1 1",
                "memcpy nodes: 1 1 1 1 801 801 1 801 1",
                "kernel nodes: 400 400 400 400 400",
                "handles: 400 400 400 400 400",
                "generic nodes: 0 0",
                "generic refusals: 1 801 1",
                "edges: 0 400 400",
                "roots: 0 1 0 0",
                "destroyed: 0 400",
            ], r.stdout + fwd.log()
            assert r.stderr.count("is not pinned; a graph's memcpy node takes only memory from cuMemHostAlloc") == 1
            assert "refused a copy: its source is host memory outside the guest's pinned heap" in fwd.log()
            assert fwd.proc.poll() is None, fwd.log()
        finally:
            chan.close()
            region.close()


def kernel_node_request(graph: int, deps: list[int], fn: int, params: bytes = b"", again: int | None = None) -> bytes:
    """cuGraphAddKernelNode_v2's request as guest_agent/libcuda/graph.c writes it."""
    n = len(deps) if again is None else again
    body = struct.pack(f"<QQ{len(deps)}QQ", graph, len(deps), *deps, n)
    body += struct.pack("<Q8I", fn, 1, 1, 1, 32, 1, 1, 0, 0)
    return body + struct.pack("<Q", len(params)) + params + b"\0" * (-len(params) % 8)


def memcpy_request(graph: int, src_type: int, src_host: int, src_dev: int, dst_dev: int, n: int) -> bytes:
    """cuGraphAddMemcpyNode's request as the generated guest half writes it: a CUDA_MEMCPY3D of 200 bytes."""
    p = bytearray(200)
    struct.pack_into("<IxxxxQQ", p, 32, src_type, src_host, src_dev)
    struct.pack_into("<IxxxxQQ", p, 120, 2, 0, dst_dev)  # CU_MEMORYTYPE_DEVICE
    struct.pack_into("<QQQ", p, 176, n, 1, 1)
    return struct.pack("<QQQQ", 1, graph, 0, 0) + struct.pack("<Q", 1) + bytes(p) + struct.pack("<Q", 0)


def test_a_hostile_guest_cannot_pass_the_node_checks_on_the_wire(shm_path):
    """Raw requests, past the guest library: a kernel node whose function, graph or dependency is not
    the process's (a forged value, NULL, another kind of handle) is CUDA_ERROR_INVALID_HANDLE; a
    dependency count that disagrees with the array, or a request cut short, CUDA_ERROR_INVALID_VALUE;
    setting a kernel node's parameters through a node or executable graph not its own,
    CUDA_ERROR_INVALID_HANDLE; a memcpy node from host memory named by an offset past the heap or by a
    worker's address, or of an unknown memory type, CUDA_ERROR_INVALID_VALUE; a well formed memcpy
    node between its own allocations is added and its type read back.  The ASan/UBSan forwarder stays up."""
    with forwarder(shm_path, size="128M", asan=True) as fwd:
        region = shm.Region.open(shm_path)
        chan = shm.GuestChannel(region)
        try:
            r, rep = raw(chan, OP_CREATE, struct.pack("<QI4x", 1, 0), seq=1)
            assert r == 0, rep
            g = struct.unpack_from("<Q", rep)[0]
            r, rep = raw(chan, OP_EMPTY, struct.pack("<QQQQ", 1, g, 0, 0), seq=2)
            assert r == 0, rep
            node = struct.unpack_from("<Q", rep)[0]
            allocs = [raw(chan, OP_MEM_ALLOC, struct.pack("<QQ", 1, 4096), seq=3 + i)[1] for i in range(2)]
            a, b = (struct.unpack_from("<Q", x)[0] for x in allocs)
            bad_kernel = [
                (kernel_node_request(g, [], 0x123456700), INVALID_HANDLE),
                (kernel_node_request(g, [], node), INVALID_HANDLE),  # a node is no function
                (kernel_node_request(g, [], 0), INVALID_HANDLE),
                (kernel_node_request(g ^ (1 << 32), [], 0x123456700), INVALID_HANDLE),
                (kernel_node_request(node, [], 0x123456700), INVALID_HANDLE),  # a node is no graph
                (kernel_node_request(g, [node ^ (1 << 32)], 0x123456700), INVALID_HANDLE),
                (kernel_node_request(g, [0], 0x123456700), INVALID_HANDLE),
                (kernel_node_request(g, [g], 0x123456700), INVALID_HANDLE),  # a graph is no node
                (kernel_node_request(g, [node], 0x123456700, again=2), INVALID_VALUE),
                (kernel_node_request(g, [node], 0x123456700)[:20], INVALID_VALUE),
            ]
            got = [raw(chan, OP_KERNEL, body, seq=10 + i)[0] for i, (body, _) in enumerate(bad_kernel)]
            assert got == [want for _, want in bad_kernel]
            fn_part = kernel_node_request(g, [], 0x123456700)[24:]
            assert raw(chan, OP_KERNEL_SET, struct.pack("<Q", node ^ (1 << 32)) + fn_part, seq=30)[0] == INVALID_HANDLE
            assert raw(chan, OP_KERNEL_SET, struct.pack("<Q", g) + fn_part, seq=31)[0] == INVALID_HANDLE
            assert raw(chan, OP_EXEC_KERNEL_SET, struct.pack("<QQ", g, node) + fn_part, seq=32)[0] == INVALID_HANDLE
            bad_copy = [
                memcpy_request(g, 1, 1 << 40, 0, a, 64),  # CU_MEMORYTYPE_HOST: an offset far past the heap
                memcpy_request(g, 1, 0x7F0000001000, 0, a, 64),  # a worker's address, not an offset
                memcpy_request(g, 9, 0, b, a, 64),
                memcpy_request(g, 2, 0, b, a, 4097),
            ]
            assert [raw(chan, OP_MEMCPY, body, seq=40 + i)[0] for i, body in enumerate(bad_copy)] == [INVALID_VALUE] * 4
            r, rep = raw(chan, OP_MEMCPY, memcpy_request(g, 2, 0, b, a, 4096), seq=50)
            assert r == 0, rep
            copy_node = struct.unpack_from("<Q", rep)[0]
            r, rep = raw(chan, OP_NODE_TYPE, struct.pack("<QQ", copy_node, 1), seq=51)
            assert (r, struct.unpack_from("<I", rep)[0]) == (0, 1)  # CU_GRAPH_NODE_TYPE_MEMCPY
            assert fwd.proc.poll() is None, fwd.log()
        finally:
            chan.close()
            region.close()


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            'cuGraphAddEmptyNode = { op = 151, class = "sync", out = ["phGraphNode"], in_array = '
            '{ dependencies = "numDependencies" }, nullable = ["dependencies"] }',
            "nullable must name an in_array of values",
        ),
        (
            'cuGraphAddEmptyNode = { op = 151, class = "sync", out = ["phGraphNode"], in_array = '
            '{ dependencies = "numDependencies" }, guest = "maybe" }',
            'guest must be "cached" or "front"',
        ),
    ],
)
def test_the_generator_refuses_handle_arrays_it_cannot_translate_safely(tmp_path, entry, message):
    """Only an array of values may be nullable (a NULL handle array would skip the translation); a
    guest half is "cached" or "front"."""
    spec = tmp_path / "api.toml"
    spec.write_text(f'[handles]\nCUgraph = "graph"\nCUgraphNode = "graph_node"\n\n[fn]\n{entry}\n')
    gen = ROOT / "native" / "cuda_api" / "gen.py"
    r = subprocess.run([sys.executable, str(gen), "--check", "--spec", str(spec)], capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr, r.stderr
