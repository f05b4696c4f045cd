"""Synthetic DNN training loop: static shapes, the same allocations every step.

What it models: eager-mode training (PyTorch-style) of a stack of residual MLP blocks
(LayerNorm -> Linear(h, 4h) -> GELU -> Linear(4h, h) + residual) with a classifier head,
an optimizer (Adam or SGD with momentum) and gradient-norm clipping. Per step:

- the input batch and labels arrive;
- forward allocates each layer's saved activations layer by layer (plus short-lived
  temporaries such as the pre-residual matmul output);
- backward walks the layers in reverse, freeing each saved activation once its gradient is
  computed, allocating activation gradients (freed one op later), weight gradients (kept until
  the optimizer has run) and cuBLAS-style workspaces that are freed at once;
- clipping allocates a scalar norm per parameter; the optimizer allocates one temporary per
  parameter (Adam's ``denom``); ``zero_grad(set_to_none=True)`` then frees every gradient.

Why: this is the workload that caching allocators are tuned for -- after the first step every
request size repeats exactly, so a good allocator reaches a steady state -- and it mixes huge
(weights, activations) with tiny (4-byte scalars, per-sample statistics) requests. It is the
project's default trace.

Parameters, gradients' lifetimes and the optimizer state follow PyTorch; two simplifications:
the optimizer state is allocated up front with the parameters (PyTorch creates it lazily in
the first ``step()``), and persistent buffers (parameters, optimizer state) are left live at the
end of the trace, as in a program that is still running. Only the time column depends on the
seed: a static-shape training step is deterministic, and the jitter models kernel-time noise.
"""

from __future__ import annotations

import numpy as np

from traces.model import Trace
from traces.synth._common import (
    StepProgram, TagTable, assemble, choice, matmul_ns, memory_ns, positive, steps_for_events,
)

OPTIMIZERS = ("adam", "sgd")
_STATE_BUFFERS = {"adam": 2, "sgd": 1}  # exp_avg + exp_avg_sq; momentum buffer
SCALAR = 4  # a 0-dim float32 tensor: loss, a norm, a clip coefficient

HELP = {
    "layers": "number of residual MLP blocks",
    "hidden": "width h of each block (its inner width is 4h)",
    "batch": "samples per step",
    "classes": "outputs of the classifier head",
    "dtype_bytes": "bytes per element of parameters, activations and gradients (4 fp32, 2 half)",
    "optimizer": "adam (2 state buffers per parameter) or sgd (1 momentum buffer)",
    "steps": "training steps",
    "events": "if given, choose steps so the trace has about this many events (overrides steps)",
    "seed": "random seed (only the timing jitter depends on it)",
}


def training(*, layers: int = 12, hidden: int = 1024, batch: int = 512, classes: int = 1000,
             dtype_bytes: int = 4, optimizer: str = "adam", steps: int = 25,
             events: int | None = None, seed: int = 0) -> Trace:
    """A training-loop trace; see the module docstring. Deterministic in all parameters."""
    positive(layers=layers, hidden=hidden, batch=batch, classes=classes,
             dtype_bytes=dtype_bytes, steps=steps)
    choice("optimizer", optimizer, OPTIMIZERS)
    if events is not None:
        positive(events=events)
    params = dict(layers=layers, hidden=hidden, batch=batch, classes=classes,
                  dtype_bytes=dtype_bytes, optimizer=optimizer, steps=steps, events=events,
                  seed=seed)

    tags = TagTable()
    shapes = parameter_shapes(layers, hidden, classes)
    prologue = persistent_program(shapes, dtype_bytes, optimizer, tags)
    step = step_program(layers, hidden, batch, classes, dtype_bytes, optimizer, shapes, tags)
    if events is not None:
        steps = steps_for_events(events, prologue.n_events, step.n_events)
        params["steps"] = steps

    rng = np.random.default_rng(seed)
    parts = [
        prologue.render(np.ones((1, 1)), first_id=0, rng=rng),
        step.render(np.ones((steps, 1)), first_id=prologue.n_slots, rng=rng),
    ]
    return assemble(parts, tags, kind="training", params=params)


def parameter_shapes(layers: int, hidden: int, classes: int) -> dict[str, int]:
    """Element count of every parameter tensor, by name, in registration order."""
    shapes: dict[str, int] = {}
    for layer in range(layers):
        prefix = f"layer{layer}"
        shapes[f"{prefix}/ln.weight"] = hidden
        shapes[f"{prefix}/ln.bias"] = hidden
        shapes[f"{prefix}/fc1.weight"] = hidden * 4 * hidden
        shapes[f"{prefix}/fc1.bias"] = 4 * hidden
        shapes[f"{prefix}/fc2.weight"] = 4 * hidden * hidden
        shapes[f"{prefix}/fc2.bias"] = hidden
    shapes["head/weight"] = classes * hidden
    shapes["head/bias"] = classes
    return shapes


def _owner(name: str) -> str:
    """``layer3/fc1.weight`` -> ``layer3``: tags name the layer, not each tensor."""
    return name.split("/")[0]


def persistent_program(shapes: dict[str, int], dtype_bytes: int, optimizer: str,
                       tags: TagTable) -> StepProgram:
    """Parameters (model construction), then optimizer state; all left live."""
    program = StepProgram((), tags)
    for name, elements in shapes.items():
        # Initialisation kernels run between parameter allocations.
        program.alloc(f"param/{_owner(name)}", elements * dtype_bytes,
                      work=memory_ns(elements * dtype_bytes))
    for name, elements in shapes.items():
        for _ in range(_STATE_BUFFERS[optimizer]):
            program.alloc(f"optimizer/state/{_owner(name)}", elements * dtype_bytes)
    return program


def step_program(layers: int, hidden: int, batch: int, classes: int, dtype_bytes: int,
                 optimizer: str, shapes: dict[str, int], tags: TagTable) -> StepProgram:
    """One training step: data, forward, backward, clipping, optimizer, zero_grad."""
    p = StepProgram((), tags)
    e, b, h, f = dtype_bytes, batch, hidden, 4 * hidden
    act_h, act_f = b * h * e, b * f * e
    stats = b * 2 * 4  # LayerNorm saves per-sample mean and rstd in fp32

    # ---- data: the input batch and integer labels are copied in.
    x = p.alloc("data/input", act_h, work=memory_ns(act_h))
    labels = p.alloc("data/labels", b * 8)

    # ---- forward: saved activations per layer, kept for backward.
    saved: list[dict[str, int]] = []
    for layer in range(layers):
        t = f"forward/layer{layer}"
        s = {"x": x}
        s["ln"] = p.alloc(f"{t}/act", act_h, work=memory_ns(2 * act_h))
        s["stats"] = p.alloc(f"{t}/stats", stats)
        s["fc1"] = p.alloc(f"{t}/act", act_f, work=matmul_ns(b, h, f))
        s["gelu"] = p.alloc(f"{t}/act", act_f, work=memory_ns(2 * act_f))
        out = p.alloc(f"{t}/tmp", act_h, work=matmul_ns(b, f, h))
        x = p.alloc(f"{t}/act", act_h, work=memory_ns(3 * act_h))  # residual add
        p.free(out)
        saved.append(s)
    logits = p.alloc("forward/head/act", b * classes * e, work=matmul_ns(b, h, classes))
    logp = p.alloc("forward/loss/act", b * classes * 4, work=memory_ns(b * classes * 8))
    loss = p.alloc("forward/loss/scalar", SCALAR, work=memory_ns(b * classes * 4))

    # ---- backward, reverse order. Weight gradients live until zero_grad.
    grads: list[int] = []

    def weight_grad(layer: str, name: str, work: float) -> None:
        grads.append(p.alloc(f"backward/{layer}/grad", shapes[f"{layer}/{name}"] * e, work=work))

    g_loss = p.alloc("backward/loss/grad", SCALAR)
    g_logits = p.alloc("backward/head/act_grad", b * classes * e,
                       work=memory_ns(b * classes * 8))
    p.free(g_loss, logp)
    weight_grad("head", "weight", matmul_ns(classes, b, h))
    weight_grad("head", "bias", memory_ns(b * classes * e))
    g = p.alloc("backward/head/act_grad", act_h, work=matmul_ns(b, classes, h))
    p.free(g_logits, logits, loss, x)  # x: the last block's output, the head's input

    for layer in reversed(range(layers)):
        t, s = f"backward/layer{layer}", saved[layer]
        owner = f"layer{layer}"
        # fc2: the residual passes g through unchanged, so fc2 sees g too.
        ws = p.alloc(f"{t}/workspace", _workspace(b, f, h, e), work=0.0)
        weight_grad(owner, "fc2.weight", matmul_ns(f, b, h))
        p.free(ws)
        weight_grad(owner, "fc2.bias", memory_ns(act_h))
        g_gelu = p.alloc(f"{t}/act_grad", act_f, work=matmul_ns(b, h, f))
        p.free(s["gelu"])
        g_fc1 = p.alloc(f"{t}/act_grad", act_f, work=memory_ns(3 * act_f))
        p.free(g_gelu, s["fc1"])
        ws = p.alloc(f"{t}/workspace", _workspace(b, h, f, e), work=0.0)
        weight_grad(owner, "fc1.weight", matmul_ns(h, b, f))
        p.free(ws)
        weight_grad(owner, "fc1.bias", memory_ns(act_f))
        g_ln = p.alloc(f"{t}/act_grad", act_h, work=matmul_ns(b, f, h))
        p.free(g_fc1, s["ln"])
        weight_grad(owner, "ln.weight", memory_ns(2 * act_h))
        weight_grad(owner, "ln.bias", memory_ns(act_h))
        g_x = p.alloc(f"{t}/act_grad", act_h, work=memory_ns(3 * act_h))
        # g_x += g (residual), in place; then the block's input and incoming grad are done.
        p.free(g_ln, s["stats"], g, s["x"], work=memory_ns(3 * act_h))
        g = g_x
    p.free(g, labels)

    # ---- clip_grad_norm_: one scalar norm per parameter, stacked, reduced.
    norms = [p.alloc("optimizer/norm", SCALAR, work=memory_ns(shapes[n] * e)) for n in shapes]
    stacked = p.alloc("optimizer/norm", SCALAR * len(shapes))
    total = p.alloc("optimizer/norm", SCALAR)
    p.free(*norms, stacked)
    coef = p.alloc("optimizer/norm", SCALAR)
    p.free(total, coef)

    # ---- optimizer step: Adam builds one denominator temporary per parameter.
    for name, elements in shapes.items():
        if optimizer == "adam":
            tmp = p.alloc("optimizer/tmp", elements * e, work=memory_ns(4 * elements * e))
            p.free(tmp, work=memory_ns(4 * elements * e))
    # ---- zero_grad(set_to_none=True). SGD's momentum update is in place (no temporaries), so
    # its time shows up as the gap before the first gradient is freed.
    sgd_ns = memory_ns(3 * sum(shapes.values()) * e) if optimizer == "sgd" else 0.0
    p.free(*grads, work=sgd_ns)
    p.require_closed()
    return p


def _workspace(m: int, k: int, n: int, e: int) -> int:
    """A split-K style GEMM workspace: a fraction of the output, at least 1 MiB + a tail.

    Real cuBLAS/cuDNN workspace sizes are opaque; what matters is that they are short-lived
    and not aligned to the activation sizes around them.
    """
    return max(1 << 20, (k * n * e) // 8) + 4 * m
