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

Compilation and checkpointing (``mode``), for "what does compilation change" experiments. Per
block (sizes for batch b, width h, inner width 4h, e bytes per element):

- ``eager`` (the default, the behaviour described above): every op's output is a buffer. An
  elementwise op's output lives until its consumer has run or, when backward needs it, until
  backward. Forward per block: LayerNorm output (b*h*e) and stats, fc1 output (b*4h*e, saved
  for GELU's backward), GELU output (b*4h*e, saved as fc2's input), fc2 output (b*h*e, freed
  after the residual add) and the residual sum (b*h*e, the next block's input). With
  ``separate_bias`` each Linear is a matmul then a bias add (one more intermediate each); with
  ``dropout`` > 0 dropout follows GELU and fc2, each a 1 byte/element mask (saved) plus its
  output -- GELU's output is then freed after dropout, and the dropped activation is what fc2
  saves.
- ``fused`` (torch.compile / XLA): elementwise chains are fused into the kernel that produces
  their input. fc1 + bias + GELU (+ dropout) is one kernel writing the pre-activation (saved for
  GELU's backward), the mask (saved) and the activation fc2 consumes, which is freed right after
  fc2 (not saved); fc2 + bias (+ dropout) + residual add is one kernel writing only the block
  output. Backward recomputes the GELU activation for fc2's weight gradient (a short-lived
  buffer) and applies GELU' in the dgrad matmul's epilogue (no separate GELU-gradient buffer).
  Fewer allocations and a lower activation peak than eager; ``separate_bias`` has no effect.
  Note what the lower peak is: not fusion but a recompute choice. The saving is the GELU
  activation (b*4h*e per block) that eager saves for fc2's weight gradient and ``fused``
  drops and rematerialises in backward -- a rematerialisation decision a compiler may make,
  not something fusing kernels does. ``fused_elementwise`` measures fusion alone.
- ``fused_elementwise``: the same fused kernels (no bias-add, GELU-gradient or pre-residual
  temporaries; dropout folded into its producer) but the same saved activations as eager: the
  GELU activation fc2 consumes is kept for backward (tag ``{t}/act``) and nothing is
  recomputed. At the sizes tried (the default, and 4 layers of width 256 with batch 2048) its
  peak equals eager's to the byte: the temporaries fusion removes never coexist with the
  saved activations at the peak; it saves allocations and time.
- ``remat`` (activation checkpointing per block, as ``torch.utils.checkpoint`` does, with the
  eager kernels): forward keeps only each block's input (the checkpoint) and frees every other
  buffer as soon as its consumer has run. Backward, block by block, first replays the block's
  forward from its checkpoint (tags ``recompute/layerN/...``) up to the last buffer backward
  needs, then runs the eager backward, which frees them. The lowest activation peak, but more
  allocations than eager and a longer step (the recomputed forward's kernels).

The head (logits, log-softmax, loss) is the same in all modes. At the default sizes the step's
peak is set by parameters + optimizer state + gradients at the end of backward, so the modes
change the activation peak (eager 250 MiB, fused 156 MiB, fused_elementwise 250 MiB, remat
52 MiB) but not the overall peak; with a larger batch (or fewer, wider layers) activations
dominate and the overall peak follows them.

Optimizer updates (``optimizer_mode``, ``donate``), for buffer-donation experiments:

- ``inplace`` (default): PyTorch's ``optimizer.step()`` updates parameters and state where they
  are (the behaviour described above).
- ``functional`` without ``donate``: a JAX/optax-style step returns NEW parameters and state.
  For each parameter in turn the update allocates the new optimizer-state buffer(s) and the new
  parameter while the old ones are live (Adam's ``denom`` temporary as in the in-place step);
  after the gradients are freed, the old parameters and state are freed (the loop rebinds its
  variables after the step returns). The new buffers carry into the next step, which frees them
  in turn, so for a moment two copies of parameters + state are live: the peak rises by about
  one copy of parameters + state.
- ``functional`` with ``donate=True`` (JAX's ``donate_argnums``): the step writes its outputs
  into the donated input buffers, so it allocates nothing new -- under ``pattern=eager``
  modelled as exactly the in-place step's events (so there, donation and in-place are the same
  trace by construction; ``pattern=jax`` derives donation from output-aliases-input instead).
  ``donate=True`` with ``optimizer_mode=inplace`` is an error.

Allocation pattern (``pattern``), for "what does a jitted JAX program ask for" experiments:

- ``eager`` (default): every buffer of the step is its own allocation -- what PyTorch, or JAX
  without ``jit``, asks its allocator for (all of the above).
- ``jax``: a jitted step (:mod:`allocsim.traces.synth.jit`). Per step the arguments (the batch),
  ONE temp buffer (tag ``jit(step)/temp``) whose size is XLA's plan of the step's
  intermediates -- every buffer the ``mode``'s program allocates and frees inside the step,
  gradients and optimizer temporaries included, placed with :mod:`allocsim.traces.plan`
  at offsets aligned to ``temp_alignment`` (64, XLA:CPU's, the default; 256 on XLA:GPU) -- and
  the outputs (``jit(step)/output/...``: the loss and, without donation, the new parameters
  and state; the old ones are freed after the step returns, the previous loss too). With
  ``donate=True`` the new parameters and state alias the donated inputs: no new buffers, no
  frees, and the peak is lower than without donation by exactly parameters + state.
  Needs ``optimizer_mode=functional``; ``mode`` still chooses which intermediates exist.
  ``metadata["jit"]`` has the executable's temp size and the compile count (1).

Parameters, gradients' lifetimes and the optimizer state follow PyTorch; two simplifications:
the optimizer state is allocated up front with the parameters (PyTorch creates it lazily in
the first ``step()``), and persistent buffers (parameters, optimizer state) are left live at the
end of the trace, as in a program that is still running. Only the time column depends on the
seed: a static-shape training step is deterministic, and the jitter models kernel-time noise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from allocsim.errors import UserInputError
from allocsim.traces.model import Trace
from allocsim.traces.synth._common import (
    StepProgram,
    TagTable,
    assemble,
    check_optimizer_mode,
    check_pattern,
    checks_done,
    choice,
    functional_update,
    inherit_persistent,
    matmul_ns,
    memory_ns,
    positive,
    steps_for_events,
    within_event_limit,
)
from allocsim.traces.synth.jit import CPU_TEMP_ALIGNMENT, events_per_step, render_jit
from allocsim.traces.synth.rendering import Steps, SynthPlan, planned

OPTIMIZERS = ("adam", "sgd")
MODES = ("eager", "fused", "fused_elementwise", "remat")
SIZE_PARAMS = ("temp_alignment",)  # accept "256B" as well as 256
_STATE_BUFFERS = {"adam": 2, "sgd": 1}  # exp_avg + exp_avg_sq; momentum buffer
SCALAR = 4  # a 0-dim float32 tensor: loss, a norm, a clip coefficient

HELP = {
    "layers": "number of residual MLP blocks",
    "hidden": "width h of each block (its inner width is 4h)",
    "batch": "samples per step",
    "classes": "outputs of the classifier head",
    "dtype_bytes": "bytes per element of parameters, activations and gradients (4 fp32, 2 half)",
    "optimizer": "adam (2 state buffers per parameter) or sgd (1 momentum buffer)",
    "mode": "eager (every op's output is a buffer; intermediates live until their consumer ran "
            "or, if saved, until backward), fused (torch.compile/XLA-style: elementwise chains "
            "fused into their producer, and the GELU activation recomputed in backward instead "
            "of saved), fused_elementwise (the same fusion, the eager saved activations) "
            "or remat (activation checkpointing: forward keeps only each block's input; backward "
            "recomputes the block's activations, block by block)",
    "dropout": "dropout probability after GELU and on each block's residual branch; 0 (the "
               "default) means no dropout layers. Only its presence changes the trace: a 1 "
               "byte/element mask is saved for backward",
    "separate_bias": "eager and remat: Linear layers run matmul then a separate bias add (x @ W "
                     "+ b), leaving the matmul output as an extra intermediate; false (default) "
                     "is nn.Linear's addmm with the bias fused in. No effect with mode=fused",
    "optimizer_mode": "inplace (default: PyTorch's optimizer.step() updates parameters and "
                      "state where they are) or functional (JAX/optax style: the step returns "
                      "new parameters and state)",
    "donate": "functional only: donate the old parameter and state buffers to the step (JAX's "
              "donate_argnums): no new parameter/state buffers. pattern=eager models it as the "
              "in-place trace; pattern=jax as outputs aliasing the donated inputs. Without "
              "donation the new buffers are allocated while the old are still live",
    "pattern": "eager (default: every buffer of the step is its own allocation, as PyTorch or "
               "JAX without jit ask for them) or jax (a jitted step: per step the arguments, ONE "
               "temp buffer sized by XLA's plan of the step's intermediates, and the outputs; "
               "needs optimizer_mode=functional, donate=true aliases outputs to inputs)",
    "temp_alignment": "pattern=jax: offset alignment of the temp buffer's plan, 64 (XLA:CPU, "
                      "the default, as the bundled recordings) or 256 (XLA:GPU)",
    "steps": "training steps",
    "events": "if given, choose steps so the trace has about this many events (overrides steps)",
    "seed": "random seed (only the timing jitter depends on it)",
}


def training(*, layers: int = 12, hidden: int = 1024, batch: int = 512, classes: int = 1000,
             dtype_bytes: int = 4, optimizer: str = "adam", steps: int = 25,
             events: int | None = None, mode: str = "eager", dropout: float = 0.0,
             separate_bias: bool = False, optimizer_mode: str = "inplace", donate: bool = False,
             pattern: str = "eager", temp_alignment: int = CPU_TEMP_ALIGNMENT,
             seed: int = 0) -> Trace:
    """A training-loop trace; see the module docstring. Deterministic in all parameters."""
    positive(layers=layers, hidden=hidden, batch=batch, classes=classes,
             dtype_bytes=dtype_bytes, steps=steps)
    choice("optimizer", optimizer, OPTIMIZERS)
    choice("mode", mode, MODES)
    check_optimizer_mode(optimizer_mode, donate)
    check_pattern(pattern, optimizer_mode, temp_alignment)
    if not 0.0 <= dropout < 1.0:
        raise UserInputError(f"dropout must be in [0, 1), got {dropout!r}")
    if events is not None:
        positive(events=events)
    params = {"layers": layers, "hidden": hidden, "batch": batch, "classes": classes,
              "dtype_bytes": dtype_bytes, "optimizer": optimizer, "steps": steps, "events": events,
              "mode": mode, "dropout": dropout, "separate_bias": separate_bias,
              "optimizer_mode": optimizer_mode, "donate": donate, "seed": seed}
    if pattern != "eager":  # eager traces keep their metadata byte for byte
        params.update(pattern=pattern, temp_alignment=temp_alignment)

    tags = TagTable()
    shapes = parameter_shapes(layers, hidden, classes)
    prologue = persistent_program(shapes, dtype_bytes, optimizer, tags)
    # A donated functional update writes into the old buffers: the in-place step's allocations
    # (pattern=eager). Compiled (pattern=jax), the functional step's program is what XLA plans.
    functional = optimizer_mode == "functional" and (not donate or pattern == "jax")
    step, initial_ids = step_program(layers, hidden, batch, classes, dtype_bytes, optimizer,
                                     shapes, tags, mode=mode, dropout=dropout,
                                     separate_bias=separate_bias, functional=functional)
    streamable = pattern == "eager"  # rendered a block at a time (synth.rendering)
    if events is not None:
        per_step = events_per_step(step, donate) if pattern == "jax" else step.n_events
        within_event_limit(events, f"events={events}", streamable=streamable)
        steps = steps_for_events(events, prologue.n_events, per_step)
        params["steps"] = steps
    within_event_limit(prologue.n_events + steps * step.n_events, f"steps={steps}",
                       streamable=streamable)
    checks_done()

    rng = np.random.default_rng(seed)
    if pattern == "jax":
        first = prologue.render(np.ones((1, 1)), first_id=0, rng=rng)
        columns, jit = render_jit(step, np.ones((steps, 1)), [""] * steps, tags=tags,
                                  first_id=prologue.n_slots, rng=rng, initial_ids=initial_ids,
                                  donate=donate, temp_alignment=temp_alignment)
        trace = assemble([first, columns], tags, kind="training", params=params)
        trace.metadata["jit"] = jit
        return trace
    return planned(SynthPlan("training", params, [
        Steps(prologue, np.ones((1, 1)), first_id=0),
        Steps(step, np.ones((steps, 1)), first_id=prologue.n_slots, initial_ids=initial_ids),
    ], rng, tags))


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


class _Block:
    """One residual MLP block of the batch, op by op: what its forward (eager or fused) and its
    backward allocate and free, written into a step program. Sizes as in the module
    docstring: batch b, width h, inner width f = 4h, e bytes per element."""

    def __init__(self, p: StepProgram, batch: int, hidden: int, dtype_bytes: int, *,
                 dropout: float, separate_bias: bool) -> None:
        self.p = p
        self.b, self.h, self.f, self.e = batch, hidden, 4 * hidden, dtype_bytes
        self.act_h, self.act_f = batch * hidden * dtype_bytes, batch * 4 * hidden * dtype_bytes
        self.stats = batch * 2 * 4  # LayerNorm saves per-sample mean and rstd in fp32
        self.mask_h, self.mask_f = batch * hidden, batch * 4 * hidden  # dropout: 1 B/element
        self.dropout, self.separate_bias = dropout, separate_bias

    # ---- forward, op by op (modes "eager" and "remat").
    def eager_forward(self, t: str, x: int, *, save: bool,
                      recompute: bool = False) -> tuple[dict[str, int], int | None]:
        """Every op's output is a buffer. ``save``: keep what backward needs (else free each
        buffer once its consumer has run, as under no_grad). ``recompute``: stop as soon as
        the saved buffers exist (checkpoint's early stop) and return no block output."""
        p, b, h, f = self.p, self.b, self.h, self.f
        act_h, act_f, mask_h, mask_f = self.act_h, self.act_f, self.mask_h, self.mask_f
        dropout = self.dropout
        stats, separate_bias = self.stats, self.separate_bias
        s = {"x": x}
        ln = p.alloc(f"{t}/act", act_h, work=memory_ns(2 * act_h))
        st = p.alloc(f"{t}/stats", stats)
        if save:
            s["ln"], s["stats"] = ln, st
        else:
            p.free(st)
        if separate_bias:  # x @ W, then + b: the matmul output is an intermediate
            mm = p.alloc(f"{t}/tmp", act_f, work=matmul_ns(b, h, f))
            fc1 = p.alloc(f"{t}/act", act_f, work=memory_ns(2 * act_f))
            p.free(mm)
        else:  # addmm: nn.Linear's bias is fused into the matmul
            fc1 = p.alloc(f"{t}/act", act_f, work=matmul_ns(b, h, f))
        if not save:
            p.free(ln)
        gelu = p.alloc(f"{t}/act", act_f, work=memory_ns(2 * act_f))
        if save:
            s["fc1"] = fc1  # GELU's backward needs its input
        else:
            p.free(fc1)
        fc2_in = gelu
        if dropout:  # one kernel: a bool mask and the scaled output; GELU's output is done
            mask = p.alloc(f"{t}/dropout_mask", mask_f, work=memory_ns(2 * act_f + mask_f))
            fc2_in = p.alloc(f"{t}/act", act_f)
            p.free(gelu)
            if save:
                s["mask"] = mask
            else:
                p.free(mask)
        if save:
            s["fc2_in"] = fc2_in  # fc2's weight gradient needs its input
        if recompute and not dropout:
            return s, None  # nothing after fc2's input is saved for backward
        out = p.alloc(f"{t}/tmp", act_h, work=matmul_ns(b, f, h))
        if not save:
            p.free(fc2_in)
        if separate_bias:
            biased = p.alloc(f"{t}/tmp", act_h, work=memory_ns(2 * act_h))
            p.free(out)
            out = biased
        if dropout:  # dropout on the residual branch
            mask2 = p.alloc(f"{t}/dropout_mask", mask_h, work=memory_ns(2 * act_h + mask_h))
            dropped = p.alloc(f"{t}/tmp", act_h)
            p.free(out)
            out = dropped
            if save:
                s["mask2"] = mask2
            else:
                p.free(mask2)
        if recompute:
            p.free(out)
            return s, None
        x_out = p.alloc(f"{t}/act", act_h, work=memory_ns(3 * act_h))  # residual add
        p.free(out)
        return s, x_out

    def fused_forward(self, t: str, x: int, *,
                      recompute: bool = True) -> tuple[dict[str, int], int]:
        """Elementwise chains fused into their producer: only saved and kernel outputs exist.
        ``recompute`` (mode ``fused``): the activation fc2 consumes is not saved but recomputed
        in backward; without it (``fused_elementwise``) it is saved, as eager saves it."""
        p, b, h, f = self.p, self.b, self.h, self.f
        act_h, act_f, mask_h, mask_f = self.act_h, self.act_f, self.mask_h, self.mask_f
        dropout = self.dropout
        stats = self.stats
        s = {"x": x}
        s["ln"] = p.alloc(f"{t}/act", act_h, work=memory_ns(2 * act_h))
        s["stats"] = p.alloc(f"{t}/stats", stats)
        # fc1 + bias + GELU (+ dropout) in one kernel: writes the pre-activation (saved for
        # GELU's backward), the mask, and the activation fc2 consumes (fused: not saved,
        # recomputed in backward; fused_elementwise: saved, as fc2's weight gradient needs it).
        s["fc1"] = p.alloc(f"{t}/act", act_f, work=matmul_ns(b, h, f))
        if dropout:
            s["mask"] = p.alloc(f"{t}/dropout_mask", mask_f)
        a = p.alloc(f"{t}/fused" if recompute else f"{t}/act", act_f, work=memory_ns(act_f))
        # fc2 + bias (+ dropout) + residual add in one kernel.
        if dropout:
            s["mask2"] = p.alloc(f"{t}/dropout_mask", mask_h)
        x_out = p.alloc(f"{t}/act", act_h, work=matmul_ns(b, f, h) + memory_ns(2 * act_h))
        if recompute:
            p.free(a)
        else:
            s["fc2_in"] = a
        return s, x_out

    def backward(self, t: str, owner: str, s: dict[str, int], g: int, mode: str,
                 weight_grad: Callable[[str, str, float], None]) -> int:
        """The block's backward from the incoming gradient ``g`` and the saved buffers ``s``
        (under remat, those of the replayed forward); frees both and returns the gradient
        of the block's input. ``weight_grad(owner, name, work)`` allocates a weight
        gradient, which lives until zero_grad."""
        p, b, h, f = self.p, self.b, self.h, self.f
        act_h, act_f, mask_h, mask_f = self.act_h, self.act_f, self.mask_h, self.mask_f
        dropout = self.dropout
        e = self.e
        # fc2: the residual passes g through unchanged, so fc2 sees g too (after dropout's
        # backward, g * mask2, when the branch has dropout).
        g_branch = g
        if dropout:
            g_branch = p.alloc(f"{t}/act_grad", act_h, work=memory_ns(2 * act_h + mask_h))
            p.free(s["mask2"])
        if mode == "fused":  # fc2's input was not saved: recompute GELU (and dropout)
            s["fc2_in"] = p.alloc(f"{t}/recompute", act_f,
                                  work=memory_ns(2 * act_f + (mask_f if dropout else 0)))
        ws = p.alloc(f"{t}/workspace", _workspace(b, f, h, e), work=0.0)
        weight_grad(owner, "fc2.weight", matmul_ns(f, b, h))
        p.free(ws)
        if mode == "fused":
            p.free(s["fc2_in"])
        weight_grad(owner, "fc2.bias", memory_ns(act_h))
        if mode in ("fused", "fused_elementwise"):  # dgrad with the GELU' (and mask) epilogue
            g_fc1 = p.alloc(f"{t}/act_grad", act_f,
                            work=matmul_ns(b, h, f) + memory_ns(2 * act_f))
            if mode == "fused_elementwise":  # fc2's saved input goes as eager's does
                p.free(s["fc2_in"])
            p.free(s["fc1"], *([s["mask"]] if dropout else []))
        else:
            g_in = p.alloc(f"{t}/act_grad", act_f, work=matmul_ns(b, h, f))
            p.free(s["fc2_in"])
            if dropout:
                g_gelu = p.alloc(f"{t}/act_grad", act_f, work=memory_ns(2 * act_f + mask_f))
                p.free(g_in, s["mask"])
                g_in = g_gelu
            g_fc1 = p.alloc(f"{t}/act_grad", act_f, work=memory_ns(3 * act_f))
            p.free(g_in, s["fc1"])
        if g_branch != g:
            p.free(g_branch)
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
        return g_x


def step_program(layers: int, hidden: int, batch: int, classes: int, dtype_bytes: int,
                 optimizer: str, shapes: dict[str, int], tags: TagTable, *,
                 mode: str = "eager", dropout: float = 0.0, separate_bias: bool = False,
                 functional: bool = False) -> tuple[StepProgram, dict[int, int]]:
    """One training step: data, forward, backward, clipping, optimizer, zero_grad.

    Returns the program and the ``initial_ids`` its render needs (empty unless ``functional``:
    then the step frees the parameters and optimizer state the previous step handed on).
    """
    p = StepProgram((), tags)
    e, b, h = dtype_bytes, batch, hidden
    act_h = b * h * e
    block = _Block(p, batch, hidden, dtype_bytes, dropout=dropout, separate_bias=separate_bias)

    old_params: list[int] = []
    old_states: list[list[int]] = []
    initial_ids: dict[int, int] = {}
    if functional:
        old_params, old_states, initial_ids = inherit_persistent(
            p, shapes, e, _STATE_BUFFERS[optimizer])

    # ---- data: the input batch and integer labels are copied in.
    x = p.alloc("data/input", act_h, work=memory_ns(act_h))
    labels = p.alloc("data/labels", b * 8)

    # ---- forward: saved activations per layer, kept for backward (remat: only the inputs).
    saved: list[dict[str, int]] = []
    for layer in range(layers):
        t = f"forward/layer{layer}"
        if mode in ("fused", "fused_elementwise"):
            s, x = block.fused_forward(t, x, recompute=mode == "fused")
        else:
            s, out = block.eager_forward(t, x, save=mode == "eager")
            assert out is not None  # only recompute=True stops before the block's output
            x = out
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
        s = saved[layer]
        if mode == "remat":  # replay the block's forward from its checkpoint (its input)
            s, _ = block.eager_forward(f"recompute/layer{layer}", s["x"], save=True,
                                       recompute=True)
        g = block.backward(f"backward/layer{layer}", f"layer{layer}", s, g, mode, weight_grad)
    p.free(g, labels)

    _clip_grad_norm(p, shapes, e)

    if functional:
        # ---- functional step without donation: new parameters and state beside the old ones;
        # the gradients go, then the old parameters and state once the step has returned.
        functional_update(p, shapes, e, old_params, old_states, adam=optimizer == "adam")
        p.free(*grads)
        p.free(*old_params, *[slot for row in old_states for slot in row])
        p.require_closed()
        return p, initial_ids

    _optimizer_step(p, shapes, e, optimizer, grads)
    p.require_closed()
    return p, initial_ids


def _clip_grad_norm(p: StepProgram, shapes: dict[str, int], e: int) -> None:
    """clip_grad_norm_: one scalar norm per parameter, stacked, reduced."""
    norms = [p.alloc("optimizer/norm", SCALAR, work=memory_ns(shapes[n] * e)) for n in shapes]
    stacked = p.alloc("optimizer/norm", SCALAR * len(shapes))
    total = p.alloc("optimizer/norm", SCALAR)
    p.free(*norms, stacked)
    coef = p.alloc("optimizer/norm", SCALAR)
    p.free(total, coef)


def _optimizer_step(p: StepProgram, shapes: dict[str, int], e: int, optimizer: str,
                    grads: list[int]) -> None:
    """The in-place optimizer step, then zero_grad(set_to_none=True), which frees every
    gradient."""
    # Adam builds one denominator temporary per parameter.
    for elements in shapes.values():
        if optimizer == "adam":
            tmp = p.alloc("optimizer/tmp", elements * e, work=memory_ns(4 * elements * e))
            p.free(tmp, work=memory_ns(4 * elements * e))
    # ---- zero_grad(set_to_none=True). SGD's momentum update is in place (no temporaries), so
    # its time shows up as the gap before the first gradient is freed.
    sgd_ns = memory_ns(3 * sum(shapes.values()) * e) if optimizer == "sgd" else 0.0
    p.free(*grads, work=sgd_ns)


def _workspace(m: int, k: int, n: int, e: int) -> int:
    """A split-K style GEMM workspace: a fraction of the output, at least 1 MiB + a tail.

    Real cuBLAS/cuDNN workspace sizes are opaque; what matters is that they are short-lived
    and not aligned to the activation sizes around them.
    """
    return max(1 << 20, (k * n * e) // 8) + 4 * m
