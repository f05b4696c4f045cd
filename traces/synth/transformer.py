"""Synthetic transformer training with a different sequence length every step.

What it models: eager-mode training of a GPT-style decoder (pre-LayerNorm blocks of
multi-head attention without a fused/flash kernel, GELU MLP, tied embedding / LM head) with
Adam, in mixed precision: fp32 parameters, gradients and optimizer state; activations in
``act_bytes`` per element. Each step draws a sequence length between ``min_seq`` and
``max_seq``; every activation is proportional to tokens = batch * seq_len, the attention scores,
probabilities and dropout masks to batch * heads * seq_len^2, and the LM head's logits to
tokens * vocab.

Why: variable sequence lengths are the classic fragmentation stress for caching allocators.
Each step asks for slightly different sizes, so blocks cached from the previous step are
almost-but-not-quite right; splitting them leaves slivers, and reserved memory creeps upward
(users ask: "dynamic shapes make reserved memory creep: how far?").
Bucketing sequence lengths (``seq_dist=bucketed``) is the usual mitigation and can be compared.

``static_shapes=True`` pads every step to ``max_seq`` (what XLA or CUDA graphs need), so every
step's sizes are identical: the "static vs dynamic shapes" comparison. The lengths are still
drawn (so the timing jitter matches the unpadded trace's) and recorded as
``metadata["unpadded_seq_lens"]``; ``seq_lens`` holds the lengths actually used.

``mode`` and ``optimizer_mode``/``donate`` work as in :mod:`allocsim.traces.synth.training`:

- ``eager`` (default): every op's output is a buffer, as described above.
- ``fused``: elementwise chains fused into their producer. The scale + softmax + dropout kernel
  writes the probabilities and the mask (saved) and the dropped probabilities PV consumes (freed
  after PV, recomputed in backward for dV); the out-projection and fc2 kernels add bias and the
  residual in their epilogue (no separate matmul outputs); fc1 + GELU writes the pre-activation
  (saved) and the activation fc2 consumes (freed after fc2, recomputed in backward). Backward
  fuses dropout's and softmax's backward into one kernel and applies GELU' in fc1's dgrad
  epilogue. Score matrices are still materialised: this is fusion, not a flash-attention kernel.
  Its lower peak is a recompute choice, not fusion: the dropped probabilities and the GELU
  activation eager saves are dropped and rematerialised in backward.
- ``fused_elementwise``: the same fused kernels with eager's saved activations (the dropped
  probabilities and the GELU activation are kept for backward, nothing is recomputed): fusion
  alone. Its peak equals eager's at the sizes tried; it saves allocations and time.
- ``remat``: per-block activation checkpointing with the eager kernels: forward keeps only each
  block's input; backward replays the block's forward (tags ``recompute/layerN/...``) up to
  GELU, then runs its eager backward.
- ``optimizer_mode=functional`` without ``donate``: Adam returns new parameters and state,
  allocated while the old ones are live and carried into the next step (the old ones freed at
  the end of the step); with ``donate=True`` the update reuses the old buffers: under
  ``pattern=eager`` the in-place trace, by construction.

``pattern=jax`` (with ``optimizer_mode=functional``) is a jitted step as in
:mod:`allocsim.traces.synth.training`: per step the arguments, ONE temp buffer planned from the
step's intermediates, the outputs; donation aliases the new parameters and state to the old.
Each distinct sequence length is its own executable -- a recompile -- with its own temp (tag
``jit(step)[seq=128]/temp``); ``metadata["jit"]`` counts the compiles and lists each
executable's temp size. ``static_shapes=True`` compiles once.

As in :mod:`allocsim.traces.synth.training`: parameters and optimizer state are allocated first
and left live; per-step buffers are all freed within their step; ids are never reused. Not
modelled: autocast's cached low-precision weight copies, flash-attention kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from allocsim.errors import UserInputError
from allocsim.traces.model import Trace
from allocsim.traces.synth._common import (
    BYTES_PER_NS,
    FLOP_PER_NS,
    StepProgram,
    TagTable,
    assemble,
    check_optimizer_mode,
    check_pattern,
    checks_done,
    choice,
    functional_update,
    inherit_persistent,
    positive,
    steps_for_events,
    within_event_limit,
)
from allocsim.traces.synth.jit import CPU_TEMP_ALIGNMENT, events_per_step, render_jit
from allocsim.traces.synth.rendering import Steps, SynthPlan, planned

SEQ_DISTRIBUTIONS = ("uniform", "bucketed", "lognormal")
MODES = ("eager", "fused", "fused_elementwise", "remat")
SIZE_PARAMS = ("temp_alignment",)  # accept "256B" as well as 256
SCALAR = 4
FP32 = 4

HELP = {
    "layers": "transformer blocks",
    "d_model": "model width",
    "heads": "attention heads (score buffers scale with heads * seq_len^2)",
    "vocab": "vocabulary size (LM-head logits are tokens * vocab)",
    "batch": "sequences per step",
    "min_seq": "shortest sequence length",
    "max_seq": "longest sequence length (also the position-embedding size)",
    "seq_dist": "per-step sequence length: uniform, bucketed (uniform rounded up to a multiple "
                "of bucket) or lognormal (mostly short, long tail)",
    "bucket": "bucket width in tokens for seq_dist=bucketed",
    "act_bytes": "bytes per activation element (2 for bf16/fp16 autocast, 4 for fp32)",
    "static_shapes": "pad every step to max_seq (static shapes, as XLA or CUDA graphs need), so "
                     "sizes never change between steps; lengths are still drawn (and the timing "
                     "jitter is the same as without padding) but only recorded as "
                     "unpadded_seq_lens",
    "mode": "eager (every op's output is a buffer), fused (torch.compile/XLA-style: elementwise "
            "chains fused into their producer; softmax+dropout and GELU outputs that feed a "
            "matmul are recomputed in backward instead of saved), fused_elementwise (the same "
            "fusion, the eager saved activations) or remat (activation "
            "checkpointing: forward keeps only each block's input; backward recomputes the "
            "block's activations, block by block)",
    "optimizer_mode": "inplace (default: PyTorch's Adam updates parameters and state where "
                      "they are) or functional (JAX/optax style: the step returns new "
                      "parameters and state)",
    "donate": "functional only: donate the old parameter and state buffers to the step (JAX's "
              "donate_argnums): no new parameter/state buffers. pattern=eager models it as the "
              "in-place trace; pattern=jax as outputs aliasing the donated inputs. Without "
              "donation the new buffers are allocated while the old are still live",
    "pattern": "eager (default: every buffer of the step is its own allocation) or jax (a "
               "jitted step: per step the arguments, ONE temp buffer sized by XLA's plan of the "
               "step's intermediates, and the outputs; each sequence length is its own "
               "executable (a recompile); needs optimizer_mode=functional, donate=true aliases "
               "outputs to inputs)",
    "temp_alignment": "pattern=jax: offset alignment of the temp buffer's plan, 64 (XLA:CPU, "
                      "the default, as the bundled recordings) or 256 (XLA:GPU)",
    "steps": "training steps",
    "events": "if given, choose steps so the trace has about this many events (overrides steps)",
    "seed": "random seed (sequence lengths and timing jitter)",
}


def transformer(*, layers: int = 6, d_model: int = 512, heads: int = 8, vocab: int = 32000,
                batch: int = 4, min_seq: int = 64, max_seq: int = 512,
                seq_dist: str = "uniform", bucket: int = 64, act_bytes: int = 2,
                steps: int = 20, events: int | None = None, static_shapes: bool = False,
                mode: str = "eager", optimizer_mode: str = "inplace", donate: bool = False,
                pattern: str = "eager", temp_alignment: int = CPU_TEMP_ALIGNMENT,
                seed: int = 0) -> Trace:
    """A variable-sequence-length transformer training trace; see the module docstring."""
    positive(layers=layers, d_model=d_model, heads=heads, vocab=vocab, batch=batch,
             min_seq=min_seq, max_seq=max_seq, bucket=bucket, act_bytes=act_bytes, steps=steps)
    choice("seq_dist", seq_dist, SEQ_DISTRIBUTIONS)
    choice("mode", mode, MODES)
    check_optimizer_mode(optimizer_mode, donate)
    check_pattern(pattern, optimizer_mode, temp_alignment)
    if min_seq > max_seq:
        raise UserInputError(f"min_seq ({min_seq}) must be <= max_seq ({max_seq})")
    if events is not None:
        positive(events=events)
    params = {"layers": layers, "d_model": d_model, "heads": heads, "vocab": vocab, "batch": batch,
              "min_seq": min_seq, "max_seq": max_seq, "seq_dist": seq_dist, "bucket": bucket,
              "act_bytes": act_bytes, "steps": steps, "events": events,
              "static_shapes": static_shapes, "mode": mode, "optimizer_mode": optimizer_mode,
              "donate": donate, "seed": seed}
    if pattern != "eager":  # eager traces keep their metadata byte for byte
        params.update(pattern=pattern, temp_alignment=temp_alignment)

    tags = TagTable()
    shapes = parameter_shapes(layers, d_model, vocab, max_seq)
    prologue = persistent_program(shapes, tags)
    # A donated functional update writes into the old buffers: the in-place step's allocations
    # (pattern=eager). Compiled (pattern=jax), the functional step's program is what XLA plans.
    functional = optimizer_mode == "functional" and (not donate or pattern == "jax")
    step, initial_ids = step_program(layers, d_model, heads, vocab, act_bytes, shapes, tags,
                                     mode=mode, functional=functional)
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
    drawn = sequence_lengths(rng, steps, min_seq, max_seq, seq_dist, bucket)
    seq = np.full_like(drawn, max_seq) if static_shapes else drawn
    tokens = batch * seq
    values = np.stack([np.ones_like(seq), tokens, tokens * seq], axis=1)  # one, tokens, sq
    lengths: dict[str, list[int]] = {}
    if steps <= 10_000:  # small enough to keep: which length each step drew
        lengths["seq_lens"] = [int(s) for s in seq]
        if static_shapes:
            lengths["unpadded_seq_lens"] = [int(s) for s in drawn]
    if pattern != "jax":
        return planned(SynthPlan("transformer", params, [
            Steps(prologue, np.ones((1, 1)), first_id=0),
            Steps(step, values, first_id=prologue.n_slots, initial_ids=initial_ids),
        ], rng, tags, extra_metadata=lengths))
    # one executable (one compile) per sequence length: the temp's plan is made whole
    first = prologue.render(np.ones((1, 1)), first_id=0, rng=rng)
    columns, jit = render_jit(step, values, [f"[seq={n}]" for n in seq.tolist()],
                              tags=tags, first_id=prologue.n_slots, rng=rng,
                              initial_ids=initial_ids, donate=donate,
                              temp_alignment=temp_alignment)
    trace = assemble([first, columns], tags, kind="transformer", params=params)
    trace.metadata.update(jit=jit, **lengths)
    return trace


def sequence_lengths(rng: np.random.Generator, steps: int, min_seq: int, max_seq: int,
                     dist: str, bucket: int) -> np.ndarray:
    """One sequence length per step, in [min_seq, max_seq]."""
    if dist == "lognormal":
        # Text datasets: most samples short, a long tail; median at 30% of the log-range.
        lo, hi = np.log(min_seq), np.log(max_seq)
        draw = rng.lognormal(lo + 0.3 * (hi - lo), max(hi - lo, 1e-9) / 4, steps)
        return np.clip(np.rint(draw), min_seq, max_seq).astype(np.int64)
    seq = rng.integers(min_seq, max_seq, size=steps, endpoint=True, dtype=np.int64)
    if dist == "bucketed":
        # Pad up to the bucket boundary, never beyond max_seq (the position table's size).
        seq = np.minimum(-(-seq // bucket) * bucket, max(max_seq, min_seq))
    return seq


def parameter_shapes(layers: int, d: int, vocab: int, max_seq: int) -> dict[str, int]:
    """Element count of every parameter tensor (GPT-2 layout; LM head tied to the embedding)."""
    shapes = {"embed/tokens": vocab * d, "embed/positions": max_seq * d}
    for layer in range(layers):
        pre = f"layer{layer}"
        shapes.update({
            f"{pre}/ln1.weight": d, f"{pre}/ln1.bias": d,
            f"{pre}/qkv.weight": d * 3 * d, f"{pre}/qkv.bias": 3 * d,
            f"{pre}/proj.weight": d * d, f"{pre}/proj.bias": d,
            f"{pre}/ln2.weight": d, f"{pre}/ln2.bias": d,
            f"{pre}/fc1.weight": d * 4 * d, f"{pre}/fc1.bias": 4 * d,
            f"{pre}/fc2.weight": 4 * d * d, f"{pre}/fc2.bias": d,
        })
    shapes.update({"lnf/weight": d, "lnf/bias": d})
    return shapes


def _owner(name: str) -> str:
    return name.split("/")[0]


def persistent_program(shapes: dict[str, int], tags: TagTable) -> StepProgram:
    """fp32 parameters, then Adam's two fp32 state buffers per parameter; all left live."""
    program = StepProgram((), tags)
    for name, elements in shapes.items():
        program.alloc(f"param/{_owner(name)}", elements * FP32,
                      work=elements * FP32 / BYTES_PER_NS)
    for name, elements in shapes.items():
        program.alloc(f"optimizer/state/{_owner(name)}", elements * FP32)
        program.alloc(f"optimizer/state/{_owner(name)}", elements * FP32)
    return program


# Sizes and work as linear forms over a step's features: tokens (= B*S) and sq (= B*S*S).
def tok(bytes_per_token: float) -> dict[str, float]:
    """A size proportional to the tokens of the step."""
    return {"tokens": bytes_per_token}


def sq(bytes_per_entry: float) -> dict[str, float]:
    """A size proportional to the attention-score entries of the step."""
    return {"sq": bytes_per_entry}


def mm(k: int, n: int) -> dict[str, float]:
    """Work of a (tokens x k) @ (k x n) matmul."""
    return {"tokens": 2.0 * k * n / FLOP_PER_NS}


def bw(bytes_per_token: float = 0.0, bytes_per_sq: float = 0.0) -> dict[str, float]:
    """Work of a bandwidth-bound kernel over activations."""
    return {"tokens": bytes_per_token / BYTES_PER_NS, "sq": bytes_per_sq / BYTES_PER_NS}


def plus(*works: dict[str, float]) -> dict[str, float]:
    """The work of several kernels fused into one: the sum of their linear forms."""
    total: dict[str, float] = {}
    for work in works:
        for name, value in work.items():
            total[name] = total.get(name, 0.0) + value
    return total


class _Block:
    """One transformer block, op by op, symbolically in the features tokens and sq: what
    its forward (eager or fused) and its backward allocate and free, written into a step
    program. Width d, ``heads`` score entries per (sample, query, key), e bytes per
    activation element."""

    def __init__(self, p: StepProgram, d: int, heads: int, e: int) -> None:
        self.p, self.d, self.e = p, d, e
        self.hs = heads  # score entries per (sample, query, key)
        # QK^T or PV over all heads: 2 * B * S^2 * d flops
        self.attn_mm = {"sq": 2.0 * d / FLOP_PER_NS}

    # ---- one block's forward, op by op (modes "eager" and "remat").
    def eager_forward(self, t: str, x: int, *, save: bool,
                      recompute: bool = False) -> tuple[dict[str, int], int | None]:
        """Every op's output is a buffer. ``save``: keep what backward needs (else free each
        buffer once its consumer has run, as under no_grad). ``recompute``: stop as soon as
        the saved buffers exist (checkpoint's early stop) and return no block output."""
        p, d, e, hs, attn_mm = self.p, self.d, self.e, self.hs, self.attn_mm
        s = {"x": x}

        def keep(name: str, slot: int) -> None:
            if save:
                s[name] = slot
            else:
                p.free(slot)

        ln1 = p.alloc(f"{t}/act", tok(d * e), work=bw(2 * d * e))
        keep("ln1_stats", p.alloc(f"{t}/stats", tok(2 * FP32)))
        qkv = p.alloc(f"{t}/act", tok(3 * d * e), work=mm(d, 3 * d))
        keep("ln1", ln1)
        scores = p.alloc(f"{t}/attn_scores", sq(hs * e), work=attn_mm)
        probs = p.alloc(f"{t}/attn_probs", sq(hs * e), work=bw(0, 2 * hs * e))
        p.free(scores)
        mask = p.alloc(f"{t}/attn_mask", sq(hs), work=bw(0, hs))  # dropout mask, bool
        dprobs = p.alloc(f"{t}/attn_probs", sq(hs * e), work=bw(0, 2 * hs * e))
        keep("probs", probs)
        keep("mask", mask)
        ctx = p.alloc(f"{t}/act", tok(d * e), work=attn_mm)
        keep("dprobs", dprobs)
        keep("qkv", qkv)
        proj = p.alloc(f"{t}/tmp", tok(d * e), work=mm(d, d))
        keep("ctx", ctx)
        h1 = p.alloc(f"{t}/act", tok(d * e), work=bw(3 * d * e))
        p.free(proj)
        ln2 = p.alloc(f"{t}/act", tok(d * e), work=bw(2 * d * e))
        keep("ln2_stats", p.alloc(f"{t}/stats", tok(2 * FP32)))
        fc1 = p.alloc(f"{t}/act", tok(4 * d * e), work=mm(d, 4 * d))
        keep("ln2", ln2)
        gelu = p.alloc(f"{t}/act", tok(4 * d * e), work=bw(8 * d * e))
        keep("fc1", fc1)
        if recompute:  # nothing after fc2's input is saved for backward
            s["h1"], s["gelu"] = h1, gelu
            return s, None
        out = p.alloc(f"{t}/tmp", tok(d * e), work=mm(4 * d, d))
        keep("gelu", gelu)
        x = p.alloc(f"{t}/act", tok(d * e), work=bw(3 * d * e))
        keep("h1", h1)
        p.free(out)
        return s, x

    def fused_forward(self, t: str, x: int, *,
                      recompute: bool = True) -> tuple[dict[str, int], int]:
        """Elementwise chains fused into their producer: only saved and kernel outputs exist.
        ``recompute`` (mode ``fused``): the dropped probabilities and the GELU activation,
        which feed matmuls, are not saved but recomputed in backward; without it
        (``fused_elementwise``) both are saved, as eager saves them."""
        p, d, e, hs, attn_mm = self.p, self.d, self.e, self.hs, self.attn_mm
        s = {"x": x}
        s["ln1"] = p.alloc(f"{t}/act", tok(d * e), work=bw(2 * d * e))
        s["ln1_stats"] = p.alloc(f"{t}/stats", tok(2 * FP32))
        s["qkv"] = p.alloc(f"{t}/act", tok(3 * d * e), work=mm(d, 3 * d))
        scores = p.alloc(f"{t}/attn_scores", sq(hs * e), work=attn_mm)
        # scale + softmax + dropout in one kernel: probs and the mask are saved for backward;
        # the dropped probabilities feed PV (fused: recomputed in backward; else saved).
        s["probs"] = p.alloc(f"{t}/attn_probs", sq(hs * e), work=bw(0, (3 * e + 1) * hs))
        s["mask"] = p.alloc(f"{t}/attn_mask", sq(hs))
        dprobs = p.alloc(f"{t}/fused" if recompute else f"{t}/attn_probs", sq(hs * e))
        p.free(scores)
        s["ctx"] = p.alloc(f"{t}/act", tok(d * e), work=attn_mm)
        if recompute:
            p.free(dprobs)
        else:
            s["dprobs"] = dprobs
        # out-projection + bias + residual add in one kernel
        s["h1"] = p.alloc(f"{t}/act", tok(d * e), work=plus(mm(d, d), bw(2 * d * e)))
        s["ln2"] = p.alloc(f"{t}/act", tok(d * e), work=bw(2 * d * e))
        s["ln2_stats"] = p.alloc(f"{t}/stats", tok(2 * FP32))
        # fc1 + bias + GELU: the pre-activation (saved) and the activation fc2 consumes
        s["fc1"] = p.alloc(f"{t}/act", tok(4 * d * e), work=mm(d, 4 * d))
        a = p.alloc(f"{t}/fused" if recompute else f"{t}/act", tok(4 * d * e),
                    work=bw(4 * d * e))
        x = p.alloc(f"{t}/act", tok(d * e), work=plus(mm(4 * d, d), bw(2 * d * e)))
        if recompute:
            p.free(a)
        else:
            s["gelu"] = a
        return s, x

    def backward(self, t: str, o: str, s: dict[str, int], g: int, mode: str,
                 weight_grad: Callable[[str, dict[str, float] | float], None]) -> int:
        """The block's backward (layer name ``o``) from the incoming gradient ``g`` and the
        saved buffers ``s`` (under remat, those of the replayed forward); frees both and
        returns the gradient of the block's input. ``weight_grad(name, work)`` allocates
        a weight gradient, which lives until zero_grad."""
        p, d, e, hs, attn_mm = self.p, self.d, self.e, self.hs, self.attn_mm
        # MLP branch (g is the gradient of the block output; the residual passes it through)
        if mode == "fused":
            # fc2's input was not saved: recompute GELU(fc1) for its weight gradient; the dgrad
            # matmul applies GELU' in its epilogue.
            a = p.alloc(f"{t}/recompute", tok(4 * d * e), work=bw(8 * d * e))
            weight_grad(f"{o}/fc2.weight", mm(4 * d, d))
            p.free(a)
            weight_grad(f"{o}/fc2.bias", bw(d * e))
            g_fc1 = p.alloc(f"{t}/act_grad", tok(4 * d * e),
                            work=plus(mm(d, 4 * d), bw(8 * d * e)))
            p.free(s["fc1"])
        elif mode == "fused_elementwise":  # GELU saved; GELU' in the dgrad matmul's epilogue
            weight_grad(f"{o}/fc2.weight", mm(4 * d, d))
            weight_grad(f"{o}/fc2.bias", bw(d * e))
            g_fc1 = p.alloc(f"{t}/act_grad", tok(4 * d * e),
                            work=plus(mm(d, 4 * d), bw(8 * d * e)))
            p.free(s["gelu"], s["fc1"])
        else:
            weight_grad(f"{o}/fc2.weight", mm(4 * d, d))
            weight_grad(f"{o}/fc2.bias", bw(d * e))
            g_gelu = p.alloc(f"{t}/act_grad", tok(4 * d * e), work=mm(d, 4 * d))
            p.free(s["gelu"])
            g_fc1 = p.alloc(f"{t}/act_grad", tok(4 * d * e), work=bw(12 * d * e))
            p.free(g_gelu, s["fc1"])
        weight_grad(f"{o}/fc1.weight", mm(d, 4 * d))
        weight_grad(f"{o}/fc1.bias", bw(4 * d * e))
        g_ln2 = p.alloc(f"{t}/act_grad", tok(d * e), work=mm(4 * d, d))
        p.free(g_fc1, s["ln2"])
        weight_grad(f"{o}/ln2.weight", bw(2 * d * e))
        weight_grad(f"{o}/ln2.bias", bw(d * e))
        g_h1 = p.alloc(f"{t}/act_grad", tok(d * e), work=bw(3 * d * e))
        p.free(g_ln2, s["ln2_stats"], s["h1"])
        p.free(g, work=bw(3 * d * e))  # g_h1 += g (residual), in place
        # attention branch
        weight_grad(f"{o}/proj.weight", mm(d, d))
        weight_grad(f"{o}/proj.bias", bw(d * e))
        g_ctx = p.alloc(f"{t}/act_grad", tok(d * e), work=mm(d, d))
        g_dprobs = p.alloc(f"{t}/attn_grad", sq(hs * e), work=attn_mm)
        if mode == "fused":
            # the dropped probabilities were not saved: recompute probs * mask for dV; dropout's
            # and softmax's backward run as one kernel.
            dprobs = p.alloc(f"{t}/recompute", sq(hs * e), work=bw(0, (2 * e + 1) * hs))
            g_v_part = p.alloc(f"{t}/tmp", tok(d * e), work=attn_mm)  # dV = P^T @ dCtx
            p.free(dprobs)
            g_scores = p.alloc(f"{t}/attn_grad", sq(hs * e), work=bw(0, (4 * e + 1) * hs))
            p.free(g_dprobs, s["mask"], s["probs"])
        elif mode == "fused_elementwise":
            # the dropped probabilities were saved (dV); dropout's and softmax's backward
            # still run as one kernel.
            g_v_part = p.alloc(f"{t}/tmp", tok(d * e), work=attn_mm)  # dV = P^T @ dCtx
            p.free(s["dprobs"])
            g_scores = p.alloc(f"{t}/attn_grad", sq(hs * e), work=bw(0, (4 * e + 1) * hs))
            p.free(g_dprobs, s["mask"], s["probs"])
        else:
            g_v_part = p.alloc(f"{t}/tmp", tok(d * e), work=attn_mm)  # dV = P^T @ dCtx
            p.free(s["dprobs"])
            g_probs = p.alloc(f"{t}/attn_grad", sq(hs * e), work=bw(0, 3 * hs * e))
            p.free(g_dprobs, s["mask"])
            g_scores = p.alloc(f"{t}/attn_grad", sq(hs * e), work=bw(0, 3 * hs * e))
            p.free(g_probs, s["probs"])
        g_qkv = p.alloc(f"{t}/act_grad", tok(3 * d * e), work=attn_mm)
        p.free(g_scores, g_v_part, g_ctx, s["ctx"])
        weight_grad(f"{o}/qkv.weight", mm(d, 3 * d))
        weight_grad(f"{o}/qkv.bias", bw(3 * d * e))
        g_ln1 = p.alloc(f"{t}/act_grad", tok(d * e), work=mm(3 * d, d))
        p.free(g_qkv, s["qkv"], s["ln1"])
        weight_grad(f"{o}/ln1.weight", bw(2 * d * e))
        weight_grad(f"{o}/ln1.bias", bw(d * e))
        g_x = p.alloc(f"{t}/act_grad", tok(d * e), work=bw(3 * d * e))
        p.free(g_ln1, s["ln1_stats"], s["x"])
        p.free(g_h1, work=bw(3 * d * e))  # g_x += g_h1 (residual), in place
        return g_x


def step_program(layers: int, d: int, heads: int, vocab: int, e: int,
                 shapes: dict[str, int], tags: TagTable, *, mode: str = "eager",
                 functional: bool = False) -> tuple[StepProgram, dict[int, int]]:
    """One step, symbolically in the features tokens (= B*S) and sq (= B*S*S).

    Returns the program and the ``initial_ids`` its render needs (empty unless ``functional``:
    then the step frees the parameters and optimizer state the previous step handed on).
    """
    p = StepProgram(("tokens", "sq"), tags)
    block = _Block(p, d, heads, e)

    old_params: list[int] = []
    old_states: list[list[int]] = []
    initial_ids: dict[int, int] = {}
    if functional:
        old_params, old_states, initial_ids = inherit_persistent(p, shapes, FP32, 2)

    # ---- data: token ids and targets (int64), embedding lookup + positions.
    ids = p.alloc("data/tokens", tok(8))
    targets = p.alloc("data/targets", tok(8))
    x = p.alloc("forward/embed/act", tok(d * e), work=bw(3 * d * e))

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
    lnf = p.alloc("forward/lnf/act", tok(d * e), work=bw(2 * d * e))
    lnf_stats = p.alloc("forward/lnf/stats", tok(2 * FP32))
    logits = p.alloc("forward/head/logits", tok(vocab * e), work=mm(d, vocab))
    logp = p.alloc("forward/loss/log_softmax", tok(vocab * FP32), work=bw(vocab * (e + 4)))
    loss = p.alloc("forward/loss/scalar", SCALAR, work=bw(vocab * 4))

    # ---- backward.
    grads: dict[str, int] = {}

    def weight_grad(name: str, work: dict[str, float] | float) -> None:
        if name not in grads:  # a tied weight's second gradient accumulates in place
            grads[name] = p.alloc(f"backward/{_owner(name)}/grad", shapes[name] * FP32, work=work)

    g_loss = p.alloc("backward/loss/grad", SCALAR)
    g_logits = p.alloc("backward/head/act_grad", tok(vocab * e), work=bw(vocab * (e + 4)))
    p.free(g_loss, logp)
    weight_grad("embed/tokens", mm(vocab, d))  # tied LM head: dW = g_logits^T @ lnf
    g = p.alloc("backward/head/act_grad", tok(d * e), work=mm(vocab, d))
    p.free(g_logits, logits, loss)
    weight_grad("lnf/weight", bw(2 * d * e))
    weight_grad("lnf/bias", bw(d * e))
    g_x = p.alloc("backward/lnf/act_grad", tok(d * e), work=bw(3 * d * e))
    p.free(g, lnf, lnf_stats, x)
    g = g_x

    for layer in reversed(range(layers)):
        s = saved[layer]
        if mode == "remat":  # replay the block's forward from its checkpoint (its input)
            s, _ = block.eager_forward(f"recompute/layer{layer}", s["x"], save=True,
                                       recompute=True)
        g = block.backward(f"backward/layer{layer}", f"layer{layer}", s, g, mode, weight_grad)

    weight_grad("embed/positions", bw(2 * d * e))
    # the token embedding's gradient already exists (tied head): index_add_ into it in place
    p.free(g, ids, targets, work=bw(2 * d * e))

    # ---- clip_grad_norm_ and Adam (one temporary per parameter), then zero_grad.
    norms = [p.alloc("optimizer/norm", SCALAR, work=shapes[n] * FP32 / BYTES_PER_NS)
             for n in shapes]
    stacked = p.alloc("optimizer/norm", SCALAR * len(shapes))
    total = p.alloc("optimizer/norm", SCALAR)
    p.free(*norms, stacked)
    coef = p.alloc("optimizer/norm", SCALAR)
    p.free(total, coef)
    if functional:
        # functional Adam without donation: new parameters and state beside the old ones; the
        # gradients go, then the old parameters and state once the step has returned.
        functional_update(p, shapes, FP32, old_params, old_states, adam=True)
        p.free(*[grads[name] for name in shapes if name in grads])
        p.free(*old_params, *[slot for row in old_states for slot in row])
        p.require_closed()
        return p, initial_ids
    for elements in shapes.values():
        tmp = p.alloc("optimizer/tmp", elements * FP32, work=4 * elements * FP32 / BYTES_PER_NS)
        p.free(tmp, work=4 * elements * FP32 / BYTES_PER_NS)
    p.free(*[grads[name] for name in shapes if name in grads])
    p.require_closed()
    return p, initial_ids
