"""``allocsim fidelity RECORDING``: its parser beside its handler, over
:func:`allocsim.sim.questions.fidelity.pytorch.fidelity` (PyTorch snapshots),
:func:`allocsim.sim.questions.fidelity.bfc.bfc_fidelity` (TensorFlow/JAX profiles) and
:func:`allocsim.sim.questions.fidelity.xla.xla_fidelity` (XLA dumps)."""

from __future__ import annotations

import argparse

from allocsim.sim.cli.common import (
    add_reading_options,
    capacity_option,
    examples,
    load_trace,
    print_json,
)
from allocsim.sim.questions.fidelity.pytorch import fidelity

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``fidelity`` to ``allocsim``'s subcommands (sets ``func``)."""
    p = subparsers.add_parser(
        "fidelity", help="replay a recording through the model of the allocator that made it "
                         "and compare decisions: PyTorch snapshots (pytorch), TensorFlow/JAX "
                         "profiles (bfc), TPU profiles (tpu), XLA dumps (buffer assignment)",
        description="Replays a recording through the model of the allocator that made it and "
                    "compares what the model does with what was recorded: a PyTorch memory "
                    "snapshot (torch.cuda.memory._dump_snapshot) through the pytorch model "
                    "configured as recorded (device calls); a TensorFlow or JAX profile "
                    "(.xplane.pb, or a TensorBoard/Keras log folder) through the bfc model "
                    "(each chunk handed out, its address, the bytes in use); a JAX profile "
                    "from a TPU through the tpu model (each buffer's HBM offset and size, the "
                    "bytes in use); an XLA "
                    "buffer-assignment dump against the offline plan and the policies. Exit 0 "
                    "when all match, 1 on divergence.",
        epilog=examples("allocsim fidelity tests/data/xplane/tf-cpu-default.xplane.pb",
                        "allocsim fidelity tests/data/xplane/tf-cpu-oom.xplane.pb --json"))
    p.add_argument("snapshot", metavar="RECORDING",
                   help="snapshot pickle, .xplane.pb profile or log folder, or XLA dump")
    p.add_argument("--capacity", help="device capacity (default: from the recorded oom's "
                                      "device_free, else a large device)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_reading_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``allocsim fidelity SNAPSHOT``: exit 0 when everything matched, 1 on divergence."""
    from allocsim.traces.formats.xla.dump import is_dump_path
    if getattr(args, "xla_view", None) is None and is_dump_path(args.snapshot):
        args.xla_view = "buffers"  # a dump is judged by its logical buffers against XLA's plan
    trace = load_trace(args.snapshot, args)
    from allocsim.sim.questions.fidelity.bfc import is_bfc_recording
    from allocsim.sim.questions.fidelity.tpu import is_tpu_recording, tpu_fidelity
    if is_tpu_recording(trace) or is_bfc_recording(trace):
        from allocsim.traces.allocator_records import check_allocator_records
        check_allocator_records(trace, source=str(args.snapshot))
    if is_tpu_recording(trace):   # a TPU runtime's profile: the tpu model, record by record
        tpu = tpu_fidelity(trace)
        print_json(tpu.as_dict()) if args.json else print("\n".join(tpu.lines()))
        return 0 if tpu.exact else 1
    from allocsim.sim.questions.fidelity.bfc import bfc_fidelity
    if is_bfc_recording(trace):   # a TF/JAX profile (.xplane.pb): the bfc model, not pytorch
        bfc = bfc_fidelity(trace)
        print_json(bfc.to_json_dict()) if args.json else print(bfc.text())
        return bfc.exit_status
    from allocsim.sim.kernel.device import resolve_device
    from allocsim.sim.questions.fidelity.xla import is_xla_dump_trace, xla_fidelity
    if is_xla_dump_trace(trace):  # an XLA dump: XLA's assignment against plan and policies
        capacity_bytes = capacity_option(args.capacity) if args.capacity else None
        xla = xla_fidelity(trace, device=resolve_device().device_with(capacity_bytes))
        print_json(xla.to_json_dict()) if args.json else print(xla.text())
        return xla.exit_status
    capacity = capacity_option(args.capacity) if args.capacity else None
    report = fidelity(trace, capacity=capacity)
    if args.json:
        print_json(report.to_json_dict())
    else:
        print(report.text())
    return report.exit_status
