"""Whole JAX programs, written once, run on the chip and predicted without it.

Each program is a function of a runtime ``rt`` with three verbs, the ones a JAX user's script
uses: ``rt.host(shape, dtype)`` (a host array: numpy zeros on the chip, a shape here),
``rt.put(tree)`` (``jax.device_put``) and ``rt.jit(fn, donate_argnums)`` (``jax.jit``). On the
chip (:class:`Chip`) they are JAX's own; for the prediction (:class:`Predicted`) they drive
:class:`allocsim.traces.record.tpu_program.Program`, which compiles each function for the
target with libtpu and keeps the buffers as the runtime would. The Python around them — the
loop, what is rebound, what is kept, a new batch placed each step — is the same code on both
sides, so the prediction follows the program as Python runs it.

Programs (none used to write the rules they test; sizes are the kinds' usual):

- ``lstm-nodonate``: an LSTM by ``lax.scan``, SGD with momentum, state **not donated**, a new
  batch placed each step: ``state, loss = step(state, batch)``;
- ``init-train-eval``: an MLP classifier with an **init** executable (from a key placed from the
  host), an optimiser-state init, a **train** step (Adam, donated) and an **eval** step run
  after each train step: four executables, each holding its code;
- ``conv-adam``: a convolutional net with Adam, state donated;
- ``moe-bf16``: a mixture of four experts with top-1 routing, bf16 parameters, AdamW with f32
  moments, state donated;
- ``decoder-remat``: a Llama-style decoder (RMSNorm, causal attention, SwiGLU), each layer
  under ``jax.checkpoint``, bf16 compute over f32 parameters, Adam, state donated;
- ``near-hbm``: a wide MLP whose Adam state fills most of a v5e's 15.75 GiB, donated.

Runs with JAX and numpy alone (the chip has no allocsim).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

STEPS = 3


# ====================================================================== runtimes
class Chip:
    """JAX itself: numpy host data, ``jax.device_put``, ``jax.jit``."""

    def host(self, shape: tuple[int, ...], dtype: Any) -> Any:
        import numpy as np
        return np.zeros(shape, dtype)

    def put(self, tree: Any) -> Any:
        import jax
        return jax.device_put(tree)

    def jit(self, fn: Callable[..., Any], donate_argnums: tuple[int, ...] = ()) -> Any:
        import jax
        return jax.jit(fn, donate_argnums=donate_argnums)

    def sync(self, tree: Any) -> None:
        import jax
        jax.block_until_ready(tree)


class Predicted:
    """The same verbs over allocsim's :class:`~allocsim.traces.record.tpu_program.Program`."""

    def __init__(self, target: str = "tpu-v5e") -> None:
        from allocsim.traces.record.tpu_program import Program
        self.program = Program(target)

    def host(self, shape: tuple[int, ...], dtype: Any) -> Any:
        import jax
        return jax.ShapeDtypeStruct(shape, dtype)

    def put(self, tree: Any) -> Any:
        return self.program.put(tree)

    def jit(self, fn: Callable[..., Any], donate_argnums: tuple[int, ...] = ()) -> Any:
        program = self.program

        def call(*args: Any) -> Any:
            return program.call(fn, *args, donate_argnums=donate_argnums)
        return call

    def sync(self, tree: Any) -> None:
        pass


# ====================================================================== pieces
def _adam(params: Any, grads: Any, opt: Any, lr: float = 1e-3, wd: float = 0.0) -> Any:
    import jax
    import jax.numpy as jnp
    m, v, t = opt
    t = t + 1
    m = jax.tree.map(lambda a, g: 0.9 * a + 0.1 * g.astype(a.dtype), m, grads)
    v = jax.tree.map(lambda a, g: 0.999 * a + 0.001 * jnp.square(g.astype(a.dtype)), v, grads)
    scale = jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)

    def update(p: Any, a: Any, b: Any) -> Any:
        step = lr * scale * a / (jnp.sqrt(b) + 1e-8) + lr * wd * p.astype(a.dtype)
        return (p.astype(a.dtype) - step).astype(p.dtype)
    return jax.tree.map(update, params, m, v), (m, v, t)


def _zeros_like_f32(tree: Any) -> Any:
    import jax
    import jax.numpy as jnp
    return jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), tree)


def _normal(key: Any, shapes: dict[str, tuple[int, ...]], dtype: Any) -> dict[str, Any]:
    import jax
    keys = jax.random.split(key, len(shapes))
    return {name: (jax.random.normal(k, shape) * 0.02).astype(dtype)
            for k, (name, shape) in zip(keys, sorted(shapes.items()))}


# ====================================================================== programs
def lstm_nodonate(rt: Any) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    hidden, features, length, batch_size = 1024, 256, 128, 64

    def loss_fn(params: Any, xs: Any, ys: Any) -> Any:
        def cell(carry: Any, x: Any) -> Any:
            h, c = carry
            gates = x @ params["wx"] + h @ params["wh"] + params["b"]
            i, f, g, o = jnp.split(gates, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), h @ params["out"]
        zeros = jnp.zeros((xs.shape[1], hidden), xs.dtype)
        _, preds = jax.lax.scan(cell, (zeros, zeros), xs)
        return jnp.mean((preds - ys) ** 2)

    def step(state: Any, batch: Any) -> Any:
        params, momentum = state
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        momentum = jax.tree.map(lambda m, g: 0.9 * m + g, momentum, grads)
        params = jax.tree.map(lambda p, m: p - 0.01 * m, params, momentum)
        return (params, momentum), loss

    shapes = {"wx": (features, 4 * hidden), "wh": (hidden, 4 * hidden), "b": (4 * hidden,),
              "out": (hidden, features)}
    params = {k: rt.host(s, np.float32) for k, s in shapes.items()}
    state = rt.put((params, {k: rt.host(s, np.float32) for k, s in shapes.items()}))
    train = rt.jit(step)
    for _ in range(STEPS):
        batch = rt.put((rt.host((length, batch_size, features), np.float32),
                        rt.host((length, batch_size, features), np.float32)))
        state, loss = train(state, batch)
        rt.sync(loss)


def init_train_eval(rt: Any) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    sizes = (784, 1024, 1024, 10)
    batch, eval_batch = 256, 1024

    def init(key: Any) -> Any:
        shapes: dict[str, tuple[int, ...]] = {
            f"w{i}": (a, b) for i, (a, b) in enumerate(itertools.pairwise(sizes))}
        shapes.update({f"b{i}": (b,) for i, b in enumerate(sizes[1:])})
        return _normal(key, shapes, jnp.float32)

    def init_opt(params: Any) -> Any:
        return _zeros_like_f32(params), _zeros_like_f32(params), jnp.zeros((), jnp.int32)

    def logits(params: Any, x: Any) -> Any:
        for i in range(len(sizes) - 1):
            x = x @ params[f"w{i}"] + params[f"b{i}"]
            x = jax.nn.relu(x) if i < len(sizes) - 2 else x
        return x

    def train(params: Any, opt: Any, x: Any, y: Any) -> Any:
        def loss_fn(p: Any) -> Any:
            return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits(p, x)) * y, axis=-1))
        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt = _adam(params, grads, opt)
        return params, opt, loss

    def evaluate(params: Any, x: Any, labels: Any) -> Any:
        return jnp.mean(jnp.argmax(logits(params, x), -1) == labels)

    key = rt.put(rt.host((2,), np.uint32))
    params = rt.jit(init)(key)
    opt = rt.jit(init_opt)(params)
    train_step = rt.jit(train, donate_argnums=(0, 1))
    eval_step = rt.jit(evaluate)
    x_eval = rt.put(rt.host((eval_batch, sizes[0]), np.float32))
    labels = rt.put(rt.host((eval_batch,), np.int32))
    for _ in range(STEPS):
        x, y = rt.put((rt.host((batch, sizes[0]), np.float32),
                       rt.host((batch, sizes[-1]), np.float32)))
        params, opt, loss = train_step(params, opt, x, y)
        accuracy = eval_step(params, x_eval, labels)
        rt.sync((loss, accuracy))


def conv_adam(rt: Any) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    channels = (3, 64, 128, 256)
    batch = 256

    def forward(params: Any, images: Any) -> Any:
        x = images
        for i in range(len(channels) - 1):
            x = jax.lax.conv_general_dilated(x, params[f"k{i}"], (2, 2), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            x = jax.nn.gelu(x + params[f"c{i}"])
        return jnp.mean(x, axis=(1, 2)) @ params["head"]

    def step(state: Any, images: Any, labels: Any) -> Any:
        params, opt = state

        def loss_fn(p: Any) -> Any:
            out = jax.nn.log_softmax(forward(p, images))
            return -jnp.mean(jnp.take_along_axis(out, labels[:, None], axis=1))
        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt = _adam(params, grads, opt)
        return (params, opt), loss

    shapes: dict[str, tuple[int, ...]] = {
        f"k{i}": (3, 3, a, b) for i, (a, b) in enumerate(itertools.pairwise(channels))}
    shapes.update({f"c{i}": (b,) for i, b in enumerate(channels[1:])})
    shapes["head"] = (channels[-1], 100)
    params = {k: rt.host(s, np.float32) for k, s in shapes.items()}
    moments = {k: rt.host(s, np.float32) for k, s in shapes.items()}
    state = rt.put((params, (moments, dict(moments), rt.host((), np.int32))))
    train = rt.jit(step, donate_argnums=(0,))
    for _ in range(STEPS):
        images, labels = rt.put((rt.host((batch, 32, 32, 3), np.float32),
                                 rt.host((batch,), np.int32)))
        state, loss = train(state, images, labels)
        rt.sync(loss)


def moe_bf16(rt: Any) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    experts, d_model, hidden, tokens = 4, 512, 2048, 2048
    bf16 = jnp.bfloat16

    def forward(params: Any, x: Any) -> Any:
        route = jax.nn.softmax((x @ params["router"]).astype(jnp.float32), axis=-1)
        choice = jax.nn.one_hot(jnp.argmax(route, -1), experts, dtype=bf16)
        h = jnp.einsum("td,edh->teh", x, params["w_in"])
        h = jax.nn.silu(h)
        y = jnp.einsum("teh,ehd->ted", h, params["w_out"])
        return jnp.einsum("ted,te->td", y, choice)

    def step(state: Any, x: Any, target: Any) -> Any:
        params, opt = state

        def loss_fn(p: Any) -> Any:
            return jnp.mean(jnp.square((forward(p, x) - target).astype(jnp.float32)))
        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt = _adam(params, grads, opt, wd=0.01)
        return (params, opt), loss

    shapes = {"router": (d_model, experts), "w_in": (experts, d_model, hidden),
              "w_out": (experts, hidden, d_model)}
    params = {k: rt.host(s, bf16) for k, s in shapes.items()}
    moments = {k: rt.host(s, np.float32) for k, s in shapes.items()}
    state = rt.put((params, (moments, dict(moments), rt.host((), np.int32))))
    train = rt.jit(step, donate_argnums=(0,))
    for _ in range(STEPS):
        x, target = rt.put((rt.host((tokens, d_model), bf16), rt.host((tokens, d_model), bf16)))
        state, loss = train(state, x, target)
        rt.sync(loss)


def decoder_remat(rt: Any) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    layers, d_model, heads, ffn, vocab, length, batch = 4, 512, 8, 1408, 8192, 256, 8
    bf16 = jnp.bfloat16

    def rms(x: Any, w: Any) -> Any:
        return x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1,
                                          keepdims=True) + 1e-6).astype(x.dtype) * w

    def block(x: Any, p: Any) -> Any:
        h = rms(x, p["n1"].astype(bf16))
        q, k, v = (h @ p[name].astype(bf16) for name in ("wq", "wk", "wv"))
        split = lambda t: t.reshape(batch, length, heads, d_model // heads)  # noqa: E731
        scores = jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / 8.0
        mask = jnp.tril(jnp.ones((length, length), bool))
        scores = jnp.where(mask, scores.astype(jnp.float32), -1e9)
        attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1).astype(bf16), split(v))
        x = x + attn.reshape(batch, length, d_model) @ p["wo"].astype(bf16)
        h = rms(x, p["n2"].astype(bf16))
        gate = jax.nn.silu(h @ p["w1"].astype(bf16)) * (h @ p["w3"].astype(bf16))
        return x + gate @ p["w2"].astype(bf16)

    def loss_fn(params: Any, tokens: Any) -> Any:
        x = params["embed"].astype(bf16)[tokens[:, :-1]]
        for p in params["layers"]:
            x = jax.checkpoint(block)(x, p)
        logits = (rms(x, params["norm"].astype(bf16)) @ params["embed"].astype(bf16).T)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    def step(state: Any, tokens: Any) -> Any:
        params, opt = state
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        params, opt = _adam(params, grads, opt)
        return (params, opt), loss

    layer = {"n1": (d_model,), "n2": (d_model,), "wq": (d_model, d_model),
             "wk": (d_model, d_model), "wv": (d_model, d_model), "wo": (d_model, d_model),
             "w1": (d_model, ffn), "w3": (d_model, ffn), "w2": (ffn, d_model)}

    def tree() -> Any:
        return {"embed": rt.host((vocab, d_model), np.float32),
                "norm": rt.host((d_model,), np.float32),
                "layers": [{k: rt.host(s, np.float32) for k, s in layer.items()}
                           for _ in range(layers)]}
    state = rt.put((tree(), (tree(), tree(), rt.host((), np.int32))))
    train = rt.jit(step, donate_argnums=(0,))
    for _ in range(STEPS):
        tokens = rt.put(rt.host((batch, length + 1), np.int32))
        state, loss = train(state, tokens)
        rt.sync(loss)


NEAR_HBM_WIDTH = 17920


def near_hbm(rt: Any) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    width, layers, batch = NEAR_HBM_WIDTH, 4, 512

    def step(state: Any, x: Any) -> Any:
        params, opt = state

        def loss_fn(p: Any) -> Any:
            h = x
            for w in p:
                h = jnp.tanh(h @ w)
            return jnp.mean(h * h)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        params, opt = _adam(params, grads, opt)
        return (params, opt), loss

    def weights() -> Any:
        return [rt.host((width, width), np.float32) for _ in range(layers)]
    state = rt.put((weights(), (weights(), weights(), rt.host((), np.int32))))
    train = rt.jit(step, donate_argnums=(0,))
    for _ in range(STEPS):
        x = rt.put(rt.host((batch, width), np.float32))
        state, loss = train(state, x)
        rt.sync(loss)


PROGRAMS: dict[str, Callable[[Any], None]] = {
    "lstm-nodonate": lstm_nodonate, "init-train-eval": init_train_eval,
    "conv-adam": conv_adam, "moe-bf16": moe_bf16, "decoder-remat": decoder_remat,
    "near-hbm": near_hbm}
