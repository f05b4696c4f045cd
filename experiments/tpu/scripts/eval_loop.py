"""A JAX script with training and evaluation, no donation, data made on the device: each step
splits the key eagerly, draws its batch with jax.random (an eager op), runs a jitted train step
(Adam, state not donated) and a jitted eval step whose accuracy it reads back. Run unchanged on
the chip and under ``allocsim record --framework jax --target tpu-v5e``."""

import jax
import jax.numpy as jnp

SIZES, BATCH, STEPS = (256, 2048, 2048, 16), 1024, 3


def init(key):
    keys = jax.random.split(key, len(SIZES) - 1)
    return [jax.random.normal(k, (a, b)) * 0.02 for k, a, b in zip(keys, SIZES, SIZES[1:])]


def logits(params, x):
    for w in params[:-1]:
        x = jax.nn.gelu(x @ w)
    return x @ params[-1]


@jax.jit
def train(state, x, y):
    params, m, v = state
    loss, grads = jax.value_and_grad(
        lambda p: jnp.mean(jax.nn.logsumexp(logits(p, x), -1)
                           - jnp.take_along_axis(logits(p, x), y[:, None], -1)[:, 0]))(params)
    m = [0.9 * a + 0.1 * g for a, g in zip(m, grads)]
    v = [0.999 * a + 0.001 * g * g for a, g in zip(v, grads)]
    params = [p - 1e-3 * a / (jnp.sqrt(b) + 1e-8) for p, a, b in zip(params, m, v)]
    return (params, m, v), loss


@jax.jit
def evaluate(params, x, y):
    return jnp.mean(jnp.argmax(logits(params, x), -1) == y)


key = jax.random.key(42)
key, sub = jax.random.split(key)
params = jax.jit(init)(sub)
state = (params, [jnp.zeros_like(p) for p in params], [jnp.zeros_like(p) for p in params])
for _ in range(STEPS):
    key, kx, ky = jax.random.split(key, 3)
    x = jax.random.normal(kx, (BATCH, SIZES[0]))
    y = jax.random.randint(ky, (BATCH,), 0, SIZES[-1])
    state, loss = train(state, x, y)
    accuracy = float(evaluate(state[0], x, y))
print(float(loss), accuracy)
