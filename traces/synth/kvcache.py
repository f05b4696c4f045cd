"""Synthetic LLM inference serving: KV caches that grow token by token, plus per-step temporaries.

What it models: a decoder-only model (Llama-like: GQA attention, gated MLP, fp16 weights)
served with continuous batching. Requests arrive as a Poisson stream; up to ``max_concurrent``
run at once, first come first served. A request's life:

1. prefill (one step): its prompt runs through every layer; each layer allocates the request's
   KV cache rounded up to a whole number of ``block_tokens`` tokens, plus activation
   temporaries proportional to the prompt length that are freed at once;
2. decode (one token per step): whenever the cache of a layer is full it is *re-allocated*
   one block larger -- alloc the new buffer, copy, free the old one -- as in frameworks that
   grow a contiguous cache with ``torch.cat`` (``block_tokens=1`` is exactly that);
3. finish after a random output length: every layer's cache is freed.

Each decode step also allocates and frees temporaries for the whole batch: hidden states, per
layer attention and MLP activations, logits and sampling buffers, all proportional to the
number of requests in the batch.

Why: this is the serving workload where allocators fail in practice -- long-lived buffers of
ever-changing size interleaved with short-lived ones, and the "alloc bigger before freeing the
old" pattern that needs old + new at once. Paged KV caches (vLLM) exist because of it.

Times: a decode step is memory-bound (weights plus the KV cache read once), a prefill is
compute-bound; steps with no running request are skipped rather than timed, so the trace has
no idle gaps. Model weights are allocated first and left live; requests still running when the
trace ends keep their caches.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from allocsim.errors import UserInputError
from allocsim.traces.model import OP_ALLOC, OP_FREE, Trace
from allocsim.traces.synth._common import (
    ALLOC_OVERHEAD_NS,
    BYTES_PER_NS,
    FLOP_PER_NS,
    FREE_OVERHEAD_NS,
    StepProgram,
    TagTable,
    assemble,
    checks_done,
    jittered,
    positive,
    within_event_limit,
)

FP16 = 2
FP32 = 4
SCHEDULER_NS = 50_000.0  # host-side scheduling and batching before each decode step

SIZE_PARAMS = ("bytes_per_token",)  # accept "4KiB" as well as 4096

HELP = {
    "requests": "number of requests served",
    "max_concurrent": "most requests in the running batch at once",
    "layers": "decoder layers (one KV buffer per request per layer)",
    "d_model": "model width (sizes the weights and the activation temporaries)",
    "bytes_per_token": "KV-cache bytes per token per layer (K and V), e.g. 2*kv_heads*head_dim*2",
    "block_tokens": "the cache grows in steps of this many tokens (1 = torch.cat every token)",
    "min_prompt": "shortest prompt, tokens",
    "max_prompt": "longest prompt, tokens",
    "min_output": "shortest output, tokens",
    "max_output": "longest output, tokens",
    "vocab": "vocabulary size (logits are batch * vocab fp32)",
    "load": "offered load: mean arrivals keep this fraction of max_concurrent busy",
    "events": "if given, serve enough requests for about this many events (overrides requests)",
    "seed": "random seed (arrivals, prompt and output lengths, timing jitter)",
}


def kvcache(*, requests: int = 48, max_concurrent: int = 16, layers: int = 16,
            d_model: int = 2048, bytes_per_token: int = 4096, block_tokens: int = 16,
            min_prompt: int = 16, max_prompt: int = 1024, min_output: int = 8,
            max_output: int = 256, vocab: int = 32000, load: float = 0.9,
            events: int | None = None, seed: int = 0) -> Trace:
    """An inference-serving trace with growing KV caches; see the module docstring."""
    positive(requests=requests, max_concurrent=max_concurrent, layers=layers, d_model=d_model,
             bytes_per_token=bytes_per_token, block_tokens=block_tokens, min_prompt=min_prompt,
             max_prompt=max_prompt, min_output=min_output, max_output=max_output, vocab=vocab,
             load=load)
    if min_prompt > max_prompt or min_output > max_output:
        raise UserInputError("min_prompt/min_output must not exceed max_prompt/max_output")
    if events is not None:
        positive(events=events)
        within_event_limit(events, f"events={events}")
    else:  # each request makes at least an alloc and a free
        within_event_limit(2 * requests, f"requests={requests}")
    checks_done()
    params = {"requests": requests, "max_concurrent": max_concurrent, "layers": layers,
              "d_model": d_model, "bytes_per_token": bytes_per_token, "block_tokens": block_tokens,
              "min_prompt": min_prompt, "max_prompt": max_prompt, "min_output": min_output,
              "max_output": max_output, "vocab": vocab, "load": load, "events": events,
              "seed": seed}
    model = _Model(layers, d_model, bytes_per_token, vocab)

    if events is None:
        return _serve(model, params, requests, block_tokens, cut_at=None)
    # Serve more requests than the estimate needs, then cut at a step boundary near `events`.
    n = _requests_for(events, model, params)
    for _ in range(8):
        trace = _serve(model, params, n, block_tokens, cut_at=events)
        if len(trace) >= 0.95 * events:
            break
        n = int(n * 1.5 * events / max(len(trace), 1)) + 1
    return trace


class _Model:
    """Sizes of the served model's weights and per-token activations."""

    def __init__(self, layers: int, d: int, bytes_per_token: int, vocab: int) -> None:
        self.layers, self.d, self.kv, self.vocab = layers, d, bytes_per_token, vocab
        self.ffn = -(-(8 * d // 3) // 256) * 256  # Llama's 8/3 d, rounded up to 256
        # qkv: d x (d + 2 kv_dim) where 2 kv_dim * 2 bytes = bytes_per_token
        self.attn_weights = d * (d * FP16 + bytes_per_token) + d * d * FP16
        self.mlp_weights = 3 * d * self.ffn * FP16
        self.layer_weights = self.attn_weights + self.mlp_weights + 2 * d * FP16
        self.attn_tmp = 2 * d * FP16 + bytes_per_token  # q, attention output, k and v
        self.mlp_tmp = 2 * self.ffn * FP16  # gate and up projections

    def weights_program(self, tags: TagTable) -> StepProgram:
        p = StepProgram((), tags)
        p.alloc("weights/embed", self.vocab * self.d * FP16, work=1e6)  # load from host
        for layer in range(self.layers):
            t = f"weights/layer{layer}"
            for nbytes in (self.d * FP16, self.attn_weights, self.d * FP16, self.mlp_weights):
                p.alloc(t, nbytes, work=nbytes / 25.0)  # ~25 GB/s host-to-device copy
        p.alloc("weights/norm", self.d * FP16)
        p.alloc("weights/lm_head", self.vocab * self.d * FP16, work=1e6)
        return p

    def prefill_program(self, tags: TagTable) -> tuple[StepProgram, list[int]]:
        """One request's prefill in features prompt (tokens) and cap (cache capacity, tokens).

        Returns the program and the slot of each layer's KV cache (left live).
        """
        p = StepProgram(("prompt", "cap"), tags)
        layer_flops = 2.0 * (self.layer_weights / FP16) / FLOP_PER_NS
        hidden = p.alloc("prefill/hidden", {"prompt": self.d * FP16}, work=SCHEDULER_NS)
        caches = []
        for layer in range(self.layers):
            caches.append(p.alloc(f"kv/layer{layer}", {"cap": self.kv}))
            tmp = p.alloc("prefill/attn", {"prompt": self.attn_tmp},
                          work={"prompt": layer_flops * self.attn_weights / self.layer_weights})
            p.free(tmp)
            tmp = p.alloc("prefill/mlp", {"prompt": self.mlp_tmp},
                          work={"prompt": layer_flops * self.mlp_weights / self.layer_weights})
            p.free(tmp)
        logits = p.alloc("prefill/logits", self.vocab * FP32,
                         work=self.vocab * self.d * FP16 / BYTES_PER_NS)
        p.free(hidden, logits)
        return p, caches

    def decode_program(self, tags: TagTable) -> tuple[StepProgram, np.ndarray]:
        """One decode step in features n (batch) and ctx (cached tokens read by attention).

        Returns the program and, per event, its position: 0 before the layers, 1 + layer
        inside one, layers + 1 after (growth events slot in before a layer's temporaries).
        """
        p = StepProgram(("n", "ctx"), tags)
        position: list[int] = []
        hidden = p.alloc("decode/hidden", {"n": self.d * FP16}, work=SCHEDULER_NS)
        position.append(0)
        for layer in range(self.layers):
            tmp = p.alloc("decode/attn", {"n": self.attn_tmp},
                          work={"one": self.attn_weights / BYTES_PER_NS,
                                "ctx": self.kv / BYTES_PER_NS})
            p.free(tmp)
            tmp = p.alloc("decode/mlp", {"n": self.mlp_tmp}, work=self.mlp_weights / BYTES_PER_NS)
            p.free(tmp)
            position += [1 + layer] * 4
        logits = p.alloc("decode/logits", {"n": self.vocab * FP32},
                         work=self.vocab * self.d * FP16 / BYTES_PER_NS)
        probs = p.alloc("decode/sampling", {"n": self.vocab * FP32})
        p.free(logits)
        tokens = p.alloc("decode/sampling", {"n": 8})
        p.free(probs, tokens, hidden)
        position += [self.layers + 1] * (p.n_events - len(position))
        return p, np.array(position, dtype=np.int64)


def _requests_for(events: int, model: _Model, params: dict) -> int:
    """Requests expected to produce ``events`` events, with 25% to spare."""
    layers, block = model.layers, params["block_tokens"]
    mean_out = (params["min_output"] + params["max_output"]) / 2
    busy = max(params["load"] * params["max_concurrent"], 1.0)
    per_request = (1 + 5 * layers + 3) + layers + 2 * layers * max(mean_out - 1, 0) / block
    per_request += mean_out / busy * (4 * layers + 7)  # its share of the decode steps
    return max(1, math.ceil(1.25 * events / per_request) + params["max_concurrent"])


def _schedule(arrival: list[int], output: list[int], max_concurrent: int) -> np.ndarray:
    """First-come-first-served start step of each request; a slot frees after its last token.

    A Python heap loop, but over requests, not events (a request makes hundreds of events).
    """
    slots = [0] * max_concurrent
    start = np.empty(len(arrival), dtype=np.int64)
    for r, (come, length) in enumerate(zip(arrival, output)):
        begin = max(come, heapq.heappop(slots))
        start[r] = begin
        heapq.heappush(slots, begin + length)
    return start


def _serve(model: _Model, params: dict, n: int, block: int, cut_at: int | None) -> Trace:
    rng = np.random.default_rng(params["seed"])
    layers = model.layers
    prompt = rng.integers(params["min_prompt"], params["max_prompt"], n, endpoint=True)
    output = rng.integers(params["min_output"], params["max_output"], n, endpoint=True)
    rate = params["load"] * params["max_concurrent"] / output.mean()  # arrivals per step
    arrival = np.floor(np.cumsum(rng.exponential(1.0 / rate, n))).astype(np.int64)
    arrival -= arrival[0]
    start = _schedule(arrival.tolist(), output.tolist(), params["max_concurrent"])
    last = start + output - 1  # step of the last token; caches are freed at its end

    tags = TagTable()
    weights = model.weights_program(tags)
    prefill, prefill_cache_slots = model.prefill_program(tags)
    decode, decode_pos = model.decode_program(tags)
    cache_slots = np.array(prefill_cache_slots, dtype=np.int64)

    # Keys order events within the trace: (step, phase, position in the layer loop, sub).
    # phase 0 prefill, 1 decode, 2 finish; growth (sub 0) precedes a layer's temporaries.
    def key(step: np.ndarray, phase: int, pos: np.ndarray | int, sub: int) -> np.ndarray:
        return ((step * 3 + phase) * (layers + 2) + pos) * 2 + sub

    parts, keys = [], []
    next_id = weights.n_slots

    # ---- prefill: one row per request, request-major (requests start in arrival order).
    blocks0 = -(-prompt // block)
    values = np.stack([np.ones(n, dtype=np.int64), prompt, blocks0 * block], axis=1)
    part = prefill.render(values, first_id=next_id, rng=rng)
    cache0_id = next_id + np.arange(n)[:, None] * prefill.n_slots + cache_slots[None, :]
    next_id += n * prefill.n_slots
    parts.append(part)
    keys.append(key(np.repeat(start, prefill.n_events), 0, 0, 0))

    # ---- growth: decode token i (1..L-1) needs prompt + i slots; grow when that crosses a block.
    first = (1 - prompt) % block
    first[first == 0] = block
    growths = np.where(first <= output - 1, (output - 1 - first) // block + 1, 0)
    total = int(growths.sum())
    owner = np.repeat(np.arange(n), growths)
    g_start = np.cumsum(growths) - growths  # index of a request's first growth
    j = np.arange(total) - g_start[owner]  # which growth of its request
    step = start[owner] + first[owner] + j * block
    layer = np.arange(layers)[None, :]
    new_id = next_id + (g_start[owner] + j)[:, None] * layers + layer  # (growth, layer)
    old_id = np.where((j == 0)[:, None], cache0_id[owner], new_id - layers)
    new_size = ((blocks0[owner] + j + 1) * block * model.kv)[:, None].repeat(layers, axis=1)
    old_size = new_size - block * model.kv
    kv_tags = np.array([tags(f"kv/layer{i}") for i in range(layers)], dtype=np.int32)
    copy_ns = old_size * (2.0 / BYTES_PER_NS)  # read old + write new before the old is freed
    parts.append(_interleave(new_id, new_size, old_id, old_size, kv_tags, copy_ns, rng))
    keys.append(np.repeat(key(step[:, None], 1, 1 + layer, 0).ravel(), 2))
    last_id = np.where((growths == 0)[:, None], cache0_id,
                       next_id + (g_start + growths - 1)[:, None] * layers + layer)
    next_id += total * layers

    # ---- finish: free every layer's final cache after the request's last step.
    final_size = ((blocks0 + growths) * block * model.kv)[:, None].repeat(layers, axis=1)
    parts.append(_frees(last_id.ravel(), final_size.ravel(), np.tile(kv_tags, n), rng))
    keys.append(key(np.repeat(last, layers), 2, 0, 0))

    # ---- decode steps: batch size and tokens in context, from difference arrays over steps.
    n_steps = int(last.max()) + 2
    decoding = output > 1
    batch = np.zeros(n_steps, dtype=np.int64)
    ctx = np.zeros(n_steps, dtype=np.int64)
    np.add.at(batch, start[decoding] + 1, 1)
    np.add.at(batch, last[decoding] + 1, -1)
    base = (prompt - start)[decoding]  # tokens in context at step k: prompt + (k - start)
    np.add.at(ctx, start[decoding] + 1, base)
    np.add.at(ctx, last[decoding] + 1, -base)
    batch, ctx = np.cumsum(batch), np.cumsum(ctx)
    steps_run = np.flatnonzero(batch > 0)
    ctx = ctx[steps_run] + steps_run * batch[steps_run]
    values = np.stack([np.ones(len(steps_run), dtype=np.int64), batch[steps_run], ctx], axis=1)
    parts.append(decode.render(values, first_id=next_id, rng=rng))
    keys.append(key(steps_run[:, None], 1, decode_pos[None, :], 1).ravel())

    # ---- order everything; a stable sort keeps each block's construction order on ties.
    order = np.argsort(np.concatenate(keys), kind="stable")
    columns = {c: np.concatenate([p[c] for p in parts])[order] for c in parts[0]}
    if cut_at is not None and len(order) > cut_at:
        # Cut at the start of the step that holds event number `cut_at`: a prefix of a valid
        # trace is valid, and ending on a step boundary leaves no step half done.
        sorted_steps = np.concatenate(keys)[order] // (3 * (layers + 2) * 2)
        end = int(np.searchsorted(sorted_steps, sorted_steps[cut_at], side="left"))
        end = end if end > cut_at // 2 else cut_at
        columns = {c: v[:end] for c, v in columns.items()}
    head = weights.render(np.ones((1, 1)), first_id=0, rng=rng)
    trace = assemble([head, columns], tags, kind="kvcache", params=params)
    trace.metadata["params"]["requests"] = n
    return trace


def _interleave(new_id: np.ndarray, new_size: np.ndarray, old_id: np.ndarray,
                old_size: np.ndarray, tags: np.ndarray, copy_ns: np.ndarray,
                rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Growth events: for each (growth, layer) 'alloc new' then 'free old', adjacent."""
    rows = new_id.size
    op = np.empty((rows, 2), dtype=np.int8)
    op[:, 0], op[:, 1] = OP_ALLOC, OP_FREE
    gap = np.empty((rows, 2), dtype=np.float64)
    gap[:, 0] = ALLOC_OVERHEAD_NS
    gap[:, 1] = FREE_OVERHEAD_NS + copy_ns.ravel()
    return {
        "op": op.ravel(),
        "id": np.stack([new_id.ravel(), old_id.ravel()], axis=1).ravel(),
        "size": np.stack([new_size.ravel(), old_size.ravel()], axis=1).ravel(),
        "tag": np.repeat(np.broadcast_to(tags, new_id.shape).ravel(), 2).astype(np.int32),
        "gap_ns": jittered(rng, gap.ravel()),
    }


def _frees(ids: np.ndarray, sizes: np.ndarray, tags: np.ndarray,
           rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "op": np.full(len(ids), OP_FREE, dtype=np.int8),
        "id": ids.astype(np.int64),
        "size": sizes.astype(np.int64),
        "tag": tags.astype(np.int32),
        "gap_ns": jittered(rng, np.full(len(ids), FREE_OVERHEAD_NS)),
    }
