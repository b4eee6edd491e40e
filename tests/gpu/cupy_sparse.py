"""CuPy's cuSPARSE and cuSOLVER paths: a sparse matrix-vector product, a sparse solve and a dense
solve on fixed data; prints the results rounded (run natively and through vmgpu by
tests/gpu/test_remoting_gpu.py, the outputs must be equal)."""

import cupy as cp
import cupyx.scipy.sparse as sp
import cupyx.scipy.sparse.linalg as sl


def main() -> None:
    n = 500
    i = cp.arange(n)
    rows = cp.concatenate([i, i[:-1], i[1:]])
    cols = cp.concatenate([i, i[1:], i[:-1]])
    vals = cp.concatenate([cp.full(n, 4.0), cp.full(n - 1, -1.0), cp.full(n - 1, -1.0)])
    a = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))
    b = cp.linspace(0.0, 1.0, n)
    print(f"spmv {float((a @ b).sum()):.6f}")
    print(f"spsolve {float(sl.spsolve(a, b).sum()):.6f}")
    m = cp.eye(64) * 64 + cp.arange(64 * 64, dtype=cp.float64).reshape(64, 64) / 4096
    print(f"solve {float(cp.linalg.solve(m, cp.ones(64)).sum()):.6f}")
    print(f"cg {float(sl.cg(a, b, rtol=1e-10)[0].sum()):.6f}")


if __name__ == "__main__":
    main()
