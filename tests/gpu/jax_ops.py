"""JAX on fixed data: a jitted matmul chain, and a few steps of a small MLP trained with a
jitted gradient step; prints the results rounded (run natively and through vmgpu by
tests/gpu/test_remoting_gpu.py, the outputs must be equal)."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the guest's quota, not 75% of it

import jax
import jax.numpy as jnp


def main() -> None:
    print(f"backend {jax.default_backend()} devices {len(jax.devices())}")
    x = jnp.arange(256 * 256, dtype=jnp.float32).reshape(256, 256) / 65536.0

    @jax.jit
    def chain(a):
        return jnp.tanh(a @ a.T) @ a

    print(f"jit {float(chain(x).sum()):.4g}")

    key = jax.random.PRNGKey(0)
    k1, k2 = jax.random.split(key)
    params = {"w1": jax.random.normal(k1, (64, 128)) * 0.1, "w2": jax.random.normal(k2, (128, 1)) * 0.1}
    data = jnp.linspace(-1.0, 1.0, 512 * 64, dtype=jnp.float32).reshape(512, 64) / 8.0
    target = jnp.sin(data.sum(axis=1, keepdims=True))

    def loss(p, d, t):
        return jnp.mean((jnp.tanh(d @ p["w1"]) @ p["w2"] - t) ** 2)

    @jax.jit
    def step(p, d, t):
        val, g = jax.value_and_grad(loss)(p, d, t)
        return jax.tree_util.tree_map(lambda a, b: a - 0.05 * b, p, g), val

    for i in range(20):
        params, val = step(params, data, target)
        if i % 5 == 4:
            print(f"step {i + 1} loss {float(val):.4g}")


if __name__ == "__main__":
    main()
