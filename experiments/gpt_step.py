"""The decoder-only transformer training step every full-size JAX experiment compiles.

One SGD-with-momentum step (f32) of a GPT-style model — pre-norm blocks of causal attention and
a GELU MLP, a tied-nothing embedding and head — written once here and compiled by
experiments/jax_gpu_1b.py (docs/jax.md's 1.3B step), experiments/xla_gpu_sizes.py (compilation,
donation) and experiments/preallocate_vs_grow/xla_jobs.py (the population experiments). The
arguments are abstract (``jax.eval_shape`` of the initialiser): no array is ever allocated.
"""

from __future__ import annotations

from typing import Any

# d_model, layers, heads, mlp: GPT-3 paper's table 2.1 shapes (MLP 4 x d_model).
SIZES = {"125m": (768, 12, 12, 3072), "350m": (1024, 24, 16, 4096),
         "1.3b": (2048, 24, 16, 8192), "2.7b": (2560, 32, 32, 10240),
         "6.7b": (4096, 32, 32, 16384)}
VOCAB = 32000


def build(d_model: int, layers: int, heads: int, mlp: int, *, remat: bool,
          vocab: int = VOCAB) -> tuple[Any, Any]:
    """``(train_step, state)``: the step ``(state, tokens) -> (state, loss)`` and its abstract
    state ``(params, momentum)``. With ``remat`` each block is rematerialised in the backward
    pass (``jax.checkpoint``), as 1B-class runs do."""
    import jax
    import jax.numpy as jnp

    def init(key: Any) -> Any:
        keys = iter(jax.random.split(key, 4 * layers + 2))

        def dense(n_in: int, n_out: int) -> Any:
            return jax.random.normal(next(keys), (n_in, n_out), jnp.float32) * n_in ** -0.5

        blocks = [{"qkv": dense(d_model, 3 * d_model), "out": dense(d_model, d_model),
                   "up": dense(d_model, mlp), "down": dense(mlp, d_model),
                   "norm1": jnp.ones(d_model), "norm2": jnp.ones(d_model)}
                  for _ in range(layers)]
        return {"embed": dense(vocab, d_model), "layers": blocks, "norm": jnp.ones(d_model),
                "head": dense(d_model, vocab)}

    def norm(x: Any, scale: Any) -> Any:
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale

    def block(x: Any, p: Any) -> Any:
        b, t, _ = x.shape
        q, k, v = jnp.split(norm(x, p["norm1"]) @ p["qkv"], 3, axis=-1)

        def split_heads(a: Any) -> Any:
            return a.reshape(b, t, heads, d_model // heads)

        scores = jnp.einsum("bqhd,bkhd->bhqk", split_heads(q), split_heads(k))
        scores = scores / (d_model // heads) ** 0.5
        mask = jnp.tril(jnp.ones((t, t), bool))
        attn = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", attn, split_heads(v)).reshape(b, t, d_model)
        x = x + mixed @ p["out"]
        return x + jax.nn.gelu(norm(x, p["norm2"]) @ p["up"]) @ p["down"]

    def loss(params: Any, tokens: Any) -> Any:
        x = params["embed"][tokens[:, :-1]]
        for p in params["layers"]:
            x = jax.checkpoint(block)(x, p) if remat else block(x, p)
        logits = norm(x, params["norm"]) @ params["head"]
        labels = jax.nn.one_hot(tokens[:, 1:], vocab)
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, -1))

    def train_step(state: Any, tokens: Any) -> Any:
        params, momentum = state
        value, grads = jax.value_and_grad(loss)(params, tokens)
        momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
        params = jax.tree.map(lambda p, m: p - 1e-4 * m, params, momentum)
        return (params, momentum), value

    params = jax.eval_shape(init, jax.random.key(0))
    # The momentum is leaves of its own (one abstract leaf object in both trees would be one
    # pytree leaf twice, not two arrays).
    momentum = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)
    return train_step, (params, momentum)


def tokens(batch: int, length: int) -> Any:
    """The abstract token batch of a step: ``batch`` sequences of ``length`` + 1 ids."""
    import jax
    import jax.numpy as jnp
    return jax.ShapeDtypeStruct((batch, length + 1), jnp.int32)
