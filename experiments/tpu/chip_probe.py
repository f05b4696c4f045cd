"""Record what a TPU runtime's allocator does, on the chip itself, for allocsim's ``tpu`` model.

    python experiments/tpu/chip_probe.py OUT [--traces DIR] [--budget-s 420]

Runs with JAX and numpy alone (the chip has no allocsim). The TPU runtime's allocator is closed
source, so its rules are read from its own records: under ``jax.profiler`` the host plane of each
``*.xplane.pb`` holds one ``MemoryAllocation`` / ``MemoryDeallocation`` event per call with the
HBM offset (``addr``), the sizes and the running totals. Each probe below runs under a profiler
session of its own (``OUT/NAME/plugins/profile/RUN/HOST.xplane.pb``) beside ``OUT/NAME.json``
(what the probe did, in order, with ``memory_stats()`` and wall times). Probes:

- ``env``: jax, jaxlib and libtpu versions, the device, ``memory_stats()`` before any array;
- ``sizes``: ``on_device_size_in_bytes`` and the layout of arrays of many shapes and dtypes;
- ``placement``: hand-made patterns whose answer differs between best, first and last fit,
  top-down and bottom-up, with and without coalescing;
- ``random-small`` / ``random-large``: seeded random workloads (ground truth for the model);
- ``too-large``: XLA:TPU's message for a program larger than HBM;
- ``midrun``: a recording started mid-run (buffers live before the profiler starts);
- ``compaction-K``: the chip filled with equal blocks, all but one in K freed, then a request
  no hole fits (compaction), then one the free total cannot hold (the runtime's OOM);
- ``replay-NAME``: each ``.npz`` trace in ``--traces`` replayed as ``u8[n]`` buffers
  (``device_put`` / ``delete``, what ``allocsim validate --backend jax`` does);
- ``train-*``: experiments/jax_train.py's real training run (jit + donation, without
  donation, op by op);
- ``exec-*`` (``--exec NAME``, one process per compiled step, so that ``peak_bytes_in_use`` is
  the step's own; ``--list-exec`` names them for the shell to loop over):
  ``memory_analysis()`` beside the stats before compile, after compile, after the run and after
  the executable is dropped.

experiments/tpu/run_on_chip.sh runs them all in one device call and packs OUT.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _stats(device: Any) -> dict[str, int]:
    return {k: int(v) for k, v in (device.memory_stats() or {}).items()}


def package_versions() -> dict[str, str]:
    """jax, jaxlib and libtpu as installed where the probe runs (what a recording names)."""
    import importlib.metadata as md
    found = {}
    for name in ("jax", "jaxlib", "libtpu"):
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = "not installed"
    return found


def _profile_options() -> Any:
    import jax
    try:
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0
        options.host_tracer_level = 2
        return options
    except Exception:   # an older JAX: the defaults
        return None


class Probe:
    """One profiler session and the log of what was done in it."""

    def __init__(self, out: Path, name: str) -> None:
        import jax
        self.jax = jax
        self.device = jax.devices()[0]
        self.name = name
        self.out = out
        self.log: list[dict[str, Any]] = []
        self.notes: dict[str, Any] = {}
        self.live: dict[int, Any] = {}
        self.host = np.zeros(1, np.uint8)

    def __enter__(self) -> Probe:
        options = _profile_options()
        folder = str(self.out / self.name)
        if options is None:
            self.jax.profiler.start_trace(folder)
        else:
            self.jax.profiler.start_trace(folder, profiler_options=options)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        for key in list(self.live):
            self.free(key)
        self.jax.profiler.stop_trace()
        if exc[0] is not None:
            self.notes["error"] = "".join(traceback.format_exception(*exc))[-4000:]
        record = {"probe": self.name, "notes": self.notes, "events": self.log}
        (self.out / f"{self.name}.json").write_text(json.dumps(record))
        print(f"{self.name}: {len(self.log)} events, {time.perf_counter() - self.t0:.1f} s",
              flush=True)
        return None

    def _bytes(self, n: int) -> np.ndarray:
        if self.host.size < n:
            self.host = np.zeros(max(n, 2 * self.host.size), np.uint8)
        return self.host[:n]

    def alloc(self, key: int, n: int, *, stats: bool = True) -> bool:
        t = time.perf_counter()
        try:
            x = self.jax.device_put(self._bytes(n), self.device)
            x.block_until_ready()
        except Exception as err:   # the runtime's own OOM is a finding, not a failure
            self.log.append({"op": "alloc", "key": key, "n": n, "error": str(err)[:2000],
                             "wall_s": time.perf_counter() - t})
            return False
        wall = time.perf_counter() - t
        self.live[key] = x
        entry: dict[str, Any] = {"op": "alloc", "key": key, "n": n, "wall_s": wall,
                                 "on_device": x.addressable_data(0).on_device_size_in_bytes()}
        if stats:
            entry["stats"] = _stats(self.device)
        self.log.append(entry)
        return True

    def free(self, key: int, *, stats: bool = True) -> None:
        x = self.live.pop(key, None)
        if x is None:
            return
        t = time.perf_counter()
        x.delete()
        entry: dict[str, Any] = {"op": "free", "key": key, "wall_s": time.perf_counter() - t}
        if stats:
            entry["stats"] = _stats(self.device)
        self.log.append(entry)


def probe_env(out: Path) -> None:
    import importlib.metadata as md

    import jax
    info: dict[str, Any] = {"python": sys.version}
    for name in ("jax", "jaxlib", "libtpu", "libtpu-nightly", "numpy"):
        try:
            info[name] = md.version(name)
        except md.PackageNotFoundError:
            info[name] = None
    device = jax.devices()[0]
    info["device_kind"] = device.device_kind
    info["platform"] = device.platform
    info["devices"] = [str(d) for d in jax.devices()]
    try:
        from jax.extend import backend as jax_backend
        info["platform_version"] = jax_backend.get_backend().platform_version
    except Exception as err:
        info["platform_version"] = f"unavailable: {err}"
    info["stats_before_any_array"] = _stats(device)
    info["env"] = {k: v for k, v in os.environ.items() if k.startswith(("XLA", "TPU", "JAX"))}
    (out / "env.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1), flush=True)


SHAPES = [(), (1,), (2,), (7,), (100,), (127,), (128,), (129,), (256,), (1000,), (1024,),
          (1025,), (4096,), (100000,), (1, 1), (3, 5), (8, 128), (9, 128), (8, 129), (16, 128),
          (17, 129), (1, 1024), (1024, 1), (2, 2048), (33, 33), (64, 64), (100, 100),
          (1000, 1000), (1024, 1024), (3, 5, 7), (2, 8, 128), (4, 17, 129), (2, 3, 5, 7),
          (8, 8, 8, 8), (1, 1, 1, 1), (16, 1, 128), (5, 1), (32, 16), (2, 4, 4096)]
DTYPES = ["float32", "bfloat16", "float16", "int8", "uint8", "bool", "int32", "int16",
          "uint32", "int4"]
U8_LENGTHS = [1, 2, 100, 511, 512, 513, 1000, 1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096,
              4097, 8192, 10000, 65536, 65537, 100000, 1 << 20, (1 << 20) + 1, 3 * MiB + 7,
              10 ** 7, 123456789]


def probe_sizes(out: Path) -> None:
    import jax
    import jax.numpy as jnp
    device = jax.devices()[0]
    rows = []
    cases = [(s, d) for d in DTYPES for s in SHAPES] + [((n,), "uint8") for n in U8_LENGTHS]
    for shape, dtype in cases:
        row: dict[str, Any] = {"shape": list(shape), "dtype": dtype}
        try:
            host = np.zeros(shape, dtype=jnp.dtype(dtype))
            x = jax.device_put(host, device)
            x.block_until_ready()
            row["bytes"] = x.addressable_data(0).on_device_size_in_bytes()
            row["nbytes"] = int(x.nbytes)
            for attr in ("format", "layout"):
                try:
                    row[attr] = str(getattr(x, attr))
                except Exception as err:
                    row[attr] = f"unavailable: {type(err).__name__}"
            x.delete()
        except Exception as err:
            row["error"] = str(err)[:500]
        rows.append(row)
    (out / "sizes.json").write_text(json.dumps(rows, indent=0))
    print(f"sizes: {len(rows)} arrays", flush=True)


def probe_placement(out: Path) -> None:
    with Probe(out, "placement") as p:
        # Holes from the top: 6, 2, 4 MiB (3, 1, 5, 7, 8 stay). Best fit puts 1.5 MiB in the
        # 2 MiB hole, first fit from the top in the 6 MiB one, from the bottom in the 4 MiB one.
        sizes = [3, 6, 1, 2, 5, 4, 7, 8]
        for i, s in enumerate(sizes):
            p.alloc(i, s * MiB)
        for i in (1, 3, 5):
            p.free(i)
        p.alloc(10, 3 * MiB // 2)
        p.alloc(11, 7 * MiB // 2)
        p.alloc(12, 5 * MiB)
        # Coalescing: free two neighbours and ask for their sum exactly.
        p.free(2)
        p.free(4)
        p.alloc(13, 6 * MiB)
        # Small sizes: where do they go, and are they rounded to 512 B granules?
        for j, n in enumerate([1, 512, 513, 1024, 4096, 100, 65536, 1000]):
            p.alloc(20 + j, n)
        for j in (1, 3, 5):
            p.free(20 + j)
        for j, n in enumerate([512, 300, 4096]):
            p.alloc(40 + j, n)
        for key in sorted(p.live):
            p.free(key)
        # Everything freed: does the next allocation start at the top again?
        p.alloc(50, 2 * MiB)
        p.alloc(51, 2 * MiB)
        p.free(50)
        p.alloc(52, 1 * MiB)   # into the freed top block, or below the rest?
        p.alloc(53, 3 * MiB)
        # A hole exactly fitting vs a larger earlier one.
        for k in range(60, 68):
            p.alloc(k, (k - 59) * MiB)
        for k in (61, 63, 65):
            p.free(k)                           # holes of 2, 4, 6 MiB in that order from the top
        p.alloc(70, 4 * MiB)                    # exact fit in the middle hole?
        p.alloc(71, 2 * MiB)                    # exact fit in the first hole?


def probe_random(out: Path, name: str, *, seed: int, events: int, low: int, high: int,
                 cap: int) -> None:
    rng = np.random.default_rng(seed)
    with Probe(out, name) as p:
        live_bytes = 0
        sizes: dict[int, int] = {}
        key = 0
        for _ in range(events):
            if sizes and (live_bytes > cap or rng.random() < 0.45):
                victim = list(sizes)[int(rng.integers(len(sizes)))]
                live_bytes -= sizes.pop(victim)
                p.free(victim)
            else:
                n = int(np.exp(rng.uniform(np.log(low), np.log(high))))
                if p.alloc(key, n):
                    sizes[key] = n
                    live_bytes += n
                key += 1


def probe_midrun(out: Path, *, seed: int = 3, before: int = 300, events: int = 900) -> None:
    """A recording started mid-run: buffers allocated (and some freed) before the profiler
    starts, then random work that frees many of them (``tpu_fidelity``'s start state)."""
    rng = np.random.default_rng(seed)
    p = Probe(out, "midrun")
    sizes: dict[int, int] = {}
    for key in range(before):
        n = int(np.exp(rng.uniform(np.log(512), np.log(4 * MiB))))
        if p.alloc(key, n, stats=False):
            sizes[key] = n
    for key in list(sizes)[::3]:
        p.free(key, stats=False)
        sizes.pop(key)
    p.notes["before_recording"] = {"log": p.log, "stats": _stats(p.device)}
    p.log = []
    with p:
        key = before
        for _ in range(events):
            if sizes and rng.random() < 0.5:
                victim = list(sizes)[int(rng.integers(len(sizes)))]
                sizes.pop(victim)
                p.free(victim)
            else:
                n = int(np.exp(rng.uniform(np.log(512), np.log(4 * MiB))))
                if p.alloc(key, n):
                    sizes[key] = n
                key += 1


def probe_too_large(out: Path) -> None:
    """What XLA:TPU says when a program's buffers exceed HBM (at compile, not at run)."""
    import jax
    import jax.numpy as jnp

    def step(a: Any, b: Any) -> Any:
        return jnp.tanh(a @ b) @ a

    record: dict[str, Any] = {"probe": "too-large"}
    shape = jax.ShapeDtypeStruct((40000, 40000), jnp.float32)   # 6.4 GB each
    try:
        compiled = jax.jit(step).lower(shape, shape).compile()
        record["memory_analysis"] = str(compiled.memory_analysis())
    except Exception as err:
        record["error_type"] = type(err).__name__
        record["error"] = str(err)[:4000]
    (out / "too-large.json").write_text(json.dumps(record, indent=1))
    said = str(record.get("error", record.get("memory_analysis")))
    print(f"too-large: {said[:300]}", flush=True)


def probe_compaction(out: Path, keep_one_in: int, block: int) -> None:
    import jax
    with Probe(out, f"compaction-{keep_one_in}") as p:
        limit = _stats(p.device).get("bytes_limit", 16 * 1024 * MiB)
        p.notes["bytes_limit"] = limit
        key = 0
        while True:   # fill: stats only at the end, to keep the fill quick
            in_use = _stats(p.device)["bytes_in_use"] if key % 16 == 0 else 0
            if in_use and limit - in_use < 2 * block:
                break
            if not p.alloc(key, block, stats=False):
                break
            key += 1
        p.notes["filled_blocks"] = key
        p.notes["stats_full"] = _stats(p.device)
        for k in range(key):
            if k % keep_one_in:
                p.free(k, stats=False)
        p.notes["stats_holes"] = _stats(p.device)
        # Ordinary allocations first (they fit a hole), then one no hole fits.
        for j in range(3):
            p.alloc(100000 + j, block // 2)
        for j in range(3):
            p.free(100000 + j)
        p.alloc(200000, keep_one_in * block)
        p.alloc(200001, block // 2)
        # Now one the free total cannot hold: the runtime's OOM.
        free_total = limit - _stats(p.device)["bytes_in_use"]
        p.notes["free_total_before_oom_request"] = free_total
        p.alloc(300000, free_total + block)
        jax.effects_barrier()


def probe_replays(out: Path, folder: Path, budget_s: float) -> None:
    for path in sorted(folder.glob("*.npz")):
        data = np.load(path, allow_pickle=False)
        ops, ids, sizes = data["op"], data["id"], data["size"]
        name = "replay-" + path.stem
        start = time.perf_counter()
        with Probe(out, name) as p:
            p.notes["trace"] = path.name
            p.notes["events"] = len(ops)
            for i in range(len(ops)):
                if time.perf_counter() - start > budget_s:
                    p.notes["stopped_at_event"] = i
                    break
                key = int(ids[i])
                if ops[i] == 0:
                    p.alloc(key, max(int(sizes[i]), 1))
                else:
                    p.free(key)
            p.notes["replayed_events"] = len(p.log)


def probe_training(out: Path) -> None:
    sys.path.insert(0, str(REPO))
    from experiments import jax_train
    for name, kwargs in (("train-jit-donate", {}), ("train-jit-nodonate", {"donate": False}),
                         ("train-eager", {"jit": False})):
        with Probe(out, name) as p:
            p.notes["stats_before"] = _stats(p.device)
            t = time.perf_counter()
            jax_train.train(steps=5, **kwargs)
            p.notes["wall_s"] = time.perf_counter() - t
            p.notes["stats_after"] = _stats(p.device)
        gc.collect()


EXEC_CONFIGS: dict[str, dict[str, Any]] = {
    "exec-matmul": {"kind": "matmul", "n": 4096},
    "exec-gpt-small-donate": {"kind": "gpt", "dims": [512, 4, 8, 2048], "vocab": 8192,
                              "batch": 8, "length": 256, "remat": False, "donate": True},
    "exec-gpt-small-nodonate": {"kind": "gpt", "dims": [512, 4, 8, 2048], "vocab": 8192,
                                "batch": 8, "length": 256, "remat": False, "donate": False},
    "exec-gpt-small-remat": {"kind": "gpt", "dims": [512, 4, 8, 2048], "vocab": 8192,
                             "batch": 8, "length": 256, "remat": True, "donate": True},
    "exec-gpt-125m-donate": {"kind": "gpt", "dims": [768, 12, 12, 3072], "vocab": 32000,
                             "batch": 8, "length": 512, "remat": False, "donate": True},
    "exec-gpt-125m-nodonate": {"kind": "gpt", "dims": [768, 12, 12, 3072], "vocab": 32000,
                               "batch": 8, "length": 512, "remat": False, "donate": False},
    "exec-gpt-125m-remat": {"kind": "gpt", "dims": [768, 12, 12, 3072], "vocab": 32000,
                            "batch": 8, "length": 512, "remat": True, "donate": True},
}

# JAX's GPU memory settings, each in a fresh process: does the TPU runtime preallocate?
PREALLOC_SETTINGS = {
    "default": {},
    "preallocate-true-fraction-0.5": {"XLA_PYTHON_CLIENT_PREALLOCATE": "true",
                                      "XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"},
    "preallocate-false": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
    "allocator-platform": {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
}


def run_prealloc_child(out: Path, setting: str) -> None:
    """memory_stats() before any array, after the first (1 MiB) and after a 1 GiB one, in this
    process (started with the setting's environment)."""
    import jax
    device = jax.devices()[0]
    record: dict[str, Any] = {"setting": setting, "env": PREALLOC_SETTINGS[setting],
                              "before": _stats(device)}
    first = jax.device_put(np.zeros(1 << 20, np.uint8), device)
    first.block_until_ready()
    record["after_first_array"] = _stats(device)
    big = jax.device_put(np.zeros(1 << 30, np.uint8), device)
    big.block_until_ready()
    record["after_1gib"] = _stats(device)
    (out / f"prealloc-{setting}.json").write_text(json.dumps(record, indent=1))
    print(f"prealloc {setting}: reserved {record['after_first_array'].get('bytes_reserved')}, "
          f"in use {record['after_first_array'].get('bytes_in_use')}", flush=True)


def run_exec_config(out: Path, name: str) -> None:
    """One compiled step in this process: stats around compile, run and drop."""
    import jax
    import jax.numpy as jnp
    config = EXEC_CONFIGS[name]
    device = jax.devices()[0]
    record: dict[str, Any] = {"probe": name, "config": config, "stages": {}}
    stages = record["stages"]
    stages["start"] = _stats(device)
    options = _profile_options()
    jax.profiler.start_trace(str(out / name), **({} if options is None
                                                  else {"profiler_options": options}))
    try:
        if config["kind"] == "matmul":
            n = config["n"]

            def chain(a: Any, b: Any) -> Any:
                return jnp.tanh(a @ b) @ b + a

            args = [jax.device_put(np.ones((n, n), np.float32), device) for _ in range(2)]
            jitted = jax.jit(chain)
            donate = False
        else:
            sys.path.insert(0, str(REPO))
            from experiments import gpt_step
            step, abstract = gpt_step.build(*config["dims"], remat=config["remat"],
                                            vocab=config["vocab"])
            donate = config["donate"]
            jitted = jax.jit(step, donate_argnums=(0,) if donate else ())
            state = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), abstract)
            tokens = jnp.zeros((config["batch"], config["length"] + 1), jnp.int32)
            jax.block_until_ready((state, tokens))
            args = [state, tokens]
        stages["args_placed"] = _stats(device)
        lowered = jitted.lower(*args)
        compiled = lowered.compile()
        stages["compiled"] = _stats(device)
        analysis = compiled.memory_analysis()
        record["memory_analysis"] = {k: int(getattr(analysis, k)) for k in dir(analysis)
                                     if k.endswith("_in_bytes")}
        t = time.perf_counter()
        result = compiled(*args)
        jax.block_until_ready(result)
        record["first_run_s"] = time.perf_counter() - t
        stages["ran"] = _stats(device)
        t = time.perf_counter()
        result2 = compiled(*result) if donate else compiled(*args)
        jax.block_until_ready(result2)
        record["second_run_s"] = time.perf_counter() - t
        stages["ran_twice"] = _stats(device)
        del result, result2, compiled, lowered, jitted
        gc.collect()
        jax.clear_caches()
        gc.collect()
        stages["dropped"] = _stats(device)
    except Exception:
        record["error"] = traceback.format_exc()[-4000:]
    finally:
        jax.profiler.stop_trace()
    (out / f"{name}.json").write_text(json.dumps(record, indent=1))
    print(f"{name}: {json.dumps(record.get('memory_analysis'))}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--traces", type=Path)
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--exec", dest="exec_name")
    parser.add_argument("--only", default="")
    parser.add_argument("--list-exec", action="store_true")
    parser.add_argument("--prealloc", metavar="SETTING")
    parser.add_argument("--list-prealloc", action="store_true")
    args = parser.parse_args()
    if args.list_exec:   # one compiled step per process: the shell loops over these
        print(" ".join(EXEC_CONFIGS))
        return
    if args.list_prealloc:   # one process per setting, its environment set by the shell
        for name, env in PREALLOC_SETTINGS.items():
            print(name + " " + " ".join(f"{k}={v}" for k, v in env.items()))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    if args.exec_name:
        run_exec_config(args.out, args.exec_name)
        return
    if args.prealloc:
        run_prealloc_child(args.out, args.prealloc)
        return
    start = time.perf_counter()
    only = set(filter(None, args.only.split(",")))

    def wanted(name: str) -> bool:
        return not only or name in only

    def compactions() -> None:
        for keep_one_in in (2, 4, 8):
            probe_compaction(args.out, keep_one_in, 64 * MiB)

    steps = [
        ("env", lambda: probe_env(args.out)),
        ("sizes", lambda: probe_sizes(args.out)),
        ("placement", lambda: probe_placement(args.out)),
        ("random-small", lambda: probe_random(args.out, "random-small", seed=1, events=1500,
                                              low=256, high=256 * 1024, cap=64 * MiB)),
        ("random-large", lambda: probe_random(args.out, "random-large", seed=2, events=1500,
                                              low=64 * 1024, high=256 * MiB, cap=6 << 30)),
        ("compaction", compactions),
        ("train", lambda: probe_training(args.out)),
        ("midrun", lambda: probe_midrun(args.out)),
        ("too-large", lambda: probe_too_large(args.out)),
    ]
    for name, step in steps:
        if not wanted(name):
            continue
        try:
            step()
        except Exception:
            print(f"{name} failed:\n{traceback.format_exc()}", flush=True)
        gc.collect()
    if args.traces and wanted("replay"):
        left = args.budget_s - (time.perf_counter() - start)
        count = max(len(list(args.traces.glob("*.npz"))), 1)
        try:
            probe_replays(args.out, args.traces, min(max(left / count, 5.0), 30.0))
        except Exception:
            print(f"replays failed:\n{traceback.format_exc()}", flush=True)
    print(f"done in {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
