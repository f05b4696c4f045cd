"""A JAX training script as users write it, with eager ops between jitted ones: a key made and
split eagerly, parameters initialised by a jitted function, a donated train step, a running
total kept by eager adds, host batches placed with jnp.asarray. Run unchanged on the chip and
under ``allocsim record --framework jax --target tpu-v5e`` (experiments/tpu/scripts_on_chip.sh)."""

import jax
import jax.numpy as jnp
import numpy as np

WIDTH, BATCH, STEPS = 1024, 512, 4


def init(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (WIDTH, WIDTH)) * 0.02,
            "w2": jax.random.normal(k2, (WIDTH, WIDTH)) * 0.02,
            "b": jnp.zeros((WIDTH,))}


def step(params, x):
    def loss(p):
        h = jnp.tanh(x @ p["w1"] + p["b"])
        return jnp.mean((h @ p["w2"]) ** 2)
    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda a, g: a - 0.1 * g, params, grads), value


key = jax.random.key(0)
key, sub = jax.random.split(key)
params = jax.jit(init)(sub)
train = jax.jit(step, donate_argnums=0)
total = jnp.zeros(())
for i in range(STEPS):
    x = jnp.asarray(np.full((BATCH, WIDTH), 0.01 * (i + 1), np.float32))
    params, value = train(params, x)
    total = total + value
print(float(total))
