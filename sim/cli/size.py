"""``allocsim size``: the HBM each array takes on a TPU, with its tiled layout.

    allocsim size --device tpu-v5e f32[17,129] bf16[3,5,7] pred[100] s8[1000]

Shapes in XLA's notation; the rule is :mod:`allocsim.traces.tpu_layout` (read off a v5e chip:
416 arrays). ``--json`` prints a list of objects: ``shape`` as given, ``bytes``, ``layout``
(XLA's text form, as the runtime's profile records it) and ``nbytes`` (the elements' own
bytes). A shape that is not XLA's is one error line, exit 2, nothing printed before it.
"""

from __future__ import annotations

import argparse
import json

from allocsim.errors import UserInputError
from allocsim.sim.cli.common import examples
from allocsim.sim.kernel.device_profile import TPU_PROFILES, resolve_device
from allocsim.traces.tpu_layout import TpuLayout, tpu_layout

MEASURED_ON = "tpu-v5e"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``size`` to ``allocsim``'s subcommands."""
    p = subparsers.add_parser(
        "size", help="the HBM each array takes on a TPU (tiled layout, 512 B granules)",
        description="Prints the bytes each array takes on a TPU and its tiled layout, for "
                    "shapes in XLA's notation. The rule was read off a TPU v5e chip "
                    "(JAX 0.10.2, libtpu 0.0.42.1); other TPUs are assumed to tile alike.",
        epilog=examples("allocsim size --device tpu-v5e f32[17,129] bf16[3,5,7] pred[100]",
                        "allocsim size --device tpu-v5e --json s8[1000] u8[1500]"))
    p.add_argument("shapes", nargs="+", metavar="SHAPE",
                   help="an array in XLA's notation: f32[17,129], bf16[3,5,7], pred[100]")
    p.add_argument("--device", default=MEASURED_ON,
                   help=f"a TPU device profile (default {MEASURED_ON}; "
                        f"{', '.join(p.name for p in TPU_PROFILES)})")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run)


def _table(layouts: list[TpuLayout]) -> str:
    rows = [("shape", "bytes", "nbytes", "layout")]
    rows += [(x.shape, f"{x.bytes:,}", f"{x.nbytes:,}", x.layout) for x in layouts]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  ".join(cell.rjust(w) if i in (1, 2) else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``allocsim size``: 0, or a one-line error (exit 2) for a shape or device it cannot size."""
    device = resolve_device(args.device)
    if device.name not in {p.name for p in TPU_PROFILES}:
        raise UserInputError(f"--device {args.device}: not a TPU (sizes are a TPU's tiled "
                             f"layouts; TPUs: {', '.join(p.name for p in TPU_PROFILES)})")
    layouts = [tpu_layout(text) for text in args.shapes]   # all checked before any output
    if args.json:
        print(json.dumps([x.as_dict() for x in layouts], indent=1))
        return 0
    print(_table(layouts))
    if device.name != MEASURED_ON:
        print(f"(layouts measured on {MEASURED_ON}; {device.name} is assumed to tile alike)")
    return 0
