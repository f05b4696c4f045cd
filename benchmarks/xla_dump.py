"""Benchmark: importing an XLA dump module of many logical buffers.

    python -m benchmarks.xla_dump [--values 100000] [--keep DIR]

Synthesises one module's dump files in the text formats jax 0.10 writes (a live-range file,
a buffer assignment, the values file and the memory-usage report) for an unrolled program of
``--values`` instructions: 64 parameters, then one value per instruction, each used a few
positions later; every fourth value updates its operand in place (same allocation and offset,
touching live ranges); values are packed into one temp allocation by size class, with a slot
reused once its value is dead. Then times ``formats.load(folder)`` (parse, group the shared
values, build and validate the trace) and prints the seconds and the buffers found.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import tempfile
import time
from pathlib import Path

SIZES = (1024, 4096, 65536, 262144, 1048576)
PARAMS = 64
NAME = "module_0000.jit_bench.gpu_after_optimizations"


def synthesise(folder: Path, n_values: int, seed: int = 0) -> dict[str, int]:
    """Write the dump files of one synthetic module into ``folder``; returns its facts."""
    rng = random.Random(seed)
    length = PARAMS + n_values
    starts: list[int] = []
    ends: list[int] = []
    sizes: list[int] = []
    inplace: list[bool] = []
    for k in range(n_values):
        position = PARAMS + k
        if k and k % 4 == 0 and ends[-1] >= position:
            ends[-1] = position  # the previous value's last use is this in-place update
            sizes.append(sizes[-1])
            inplace.append(True)
        else:
            sizes.append(rng.choice(SIZES))
            inplace.append(False)
        starts.append(position)
        ends.append(min(length, position + rng.randint(1, 40)))
    # Pack into one temp allocation: a pool of slots per size, reused once free.
    free: dict[int, list[int]] = {s: [] for s in SIZES}
    releases: list[tuple[int, int, int]] = []  # (free after, size, offset)
    offsets: list[int] = []
    top = 0
    for k in range(n_values):
        while releases and releases[0][0] < starts[k]:
            _, size, offset = heapq.heappop(releases)
            free[size].append(offset)
        if inplace[k]:
            offset = offsets[-1]
            releases = [r for r in releases if not (r[1] == sizes[k] and r[2] == offset)]
            heapq.heapify(releases)
        elif free[sizes[k]]:
            offset = free[sizes[k]].pop()
        else:
            offset, top = top, top + sizes[k]
        offsets.append(offset)
        heapq.heappush(releases, (ends[k], sizes[k], offset))
    names = [f"fusion.{k}" for k in range(n_values)]
    params = [f"p.{k}" for k in range(PARAMS)]
    live = [f"HloLiveRange (max {length}):\n  InstructionSequence:\n"]
    live += [f"    {k}:{name}\n" for k, name in enumerate(params + names)]
    live.append("  BufferLiveRange:\n")
    live += [f"    {p}{{}}:0-{length}\n" for p in params]
    live += [f"    {n}{{}}:{s}-{e}\n" for n, s, e in zip(names, starts, ends)]
    live.append(f"  Live ranges at {length} (peak):\n")
    assign = ["BufferAssignment:\n"]
    total = 0
    for k, p in enumerate(params):
        assign.append(f"allocation {k}: size 4096, parameter {k}, shape |f32[1024]| at "
                      "ShapeIndex {}:\n")
        assign.append(f" value: <{k} {p} @0> (size=4096,offset=0): f32[1024]{{0}}\n")
        total += 4096
    assign.append(f"allocation {PARAMS}: size {top}, preallocated-temp:\n")
    assign += [f" value: <{PARAMS + k} {n} @0> (size={z},offset={o}): f32[{z // 4}]{{0}}\n"
               for k, (n, z, o) in enumerate(zip(names, sizes, offsets))]
    total += top
    values = [f"<{PARAMS + k} {n} @0>\n positions:\n  {n}\n uses:\n  (none)\n from instruction: "
              f"%{n} = f32[{z // 4}]{{0}} fusion(), metadata={{op_name=\"jit(bench)/op{k % 97}\"}}"
              "\n" for k, (n, z) in enumerate(zip(names, sizes))]
    (folder / f"{NAME}-live-range.txt").write_text("".join(live))
    (folder / f"{NAME}-buffer-assignment.txt").write_text("".join(assign))
    (folder / f"{NAME}-buffer-assignment-values.txt").write_text(
        f"Total bytes used: {total}\n\nUsed values:\n" + "".join(values))
    (folder / f"{NAME}-memory-usage-report.txt").write_text(
        f"Memory Space: default (color=0)\nTotal bytes: {total}\n")
    return {"values": n_values + PARAMS, "in_place": sum(inplace), "temp_bytes": top}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=100_000)
    parser.add_argument("--keep", metavar="DIR", help="write the dump here and keep it")
    args = parser.parse_args(argv)

    from allocsim.traces import formats

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        facts = synthesise(folder, args.values)
        size = sum(p.stat().st_size for p in folder.iterdir())
        start = time.perf_counter()
        trace = formats.load(folder, view="buffers")     # the logical buffers, as measured
        seconds = time.perf_counter() - start
    xla = trace.metadata["xla"]
    print(f"{facts['values']:,} logical values ({facts['in_place']:,} in place), "
          f"{size / 1e6:.1f} MB of dump files")
    print(f"import: {seconds:.2f} s -> {xla['buffers']:,} buffers, {len(trace):,} events, "
          f"{xla['shared_values']:,} values sharing bytes; peak live "
          f"{trace.peak_live()[0] / 2**20:.1f} MiB, XLA temp {xla['temp_bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
