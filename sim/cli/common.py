"""What every command shares, in one place: the reading options (``--strict``,
``--device-index``) and loading a trace with them, the device options (``--device``,
``--capacity``, ``--device-profile``), the output option (``-o/--out/--output``), progress
lines and JSON on stdout."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from allocsim.ascii_numbers import decimal_number, is_whole_number, whole_number
from allocsim.errors import UserInputError
from allocsim.frameworks import canonical_framework
from allocsim.policies import format_size, parse_size
from allocsim.policies.units import parse_size_floor
from allocsim.printable import printable
from allocsim.sim.kernel.device import DEFAULT_PROFILE, PROFILES, DeviceProfile
from allocsim.sim.kernel.device_profile import check_capacity, check_context, named_profile
from allocsim.traces import Trace, formats
from allocsim.traces.bundled import resolve_trace_name


class UserError(UserInputError):
    """A mistake in what the user gave on the command line; printed as one line."""


READING_GROUP = "reading the input"


def add_reading_options(parser: argparse.ArgumentParser) -> None:
    """The seven options that say how an input file becomes a trace, the same on every command
    that reads one, in their own group of ``--help`` ("reading the input") so that the
    command's own options stand out."""
    group = parser.add_argument_group(
        READING_GROUP, "how a recording becomes a trace (most files need none of these)")
    group.add_argument("--strict", action="store_true",
                       help="fail on the first anomaly in a recorded trace (default: repair "
                            "what can be repaired and report it)")
    group.add_argument("--device-index", metavar="N",
                       help="which device of a multi-device recording (default: the one with "
                            "the most events)")
    group.add_argument("--start-state", choices=["unrecorded"],
                       help="for a PyTorch profiler trace: add the bytes that were live "
                            "before recording started (the file's Total Allocated minus the "
                            "trace's live bytes) as one buffer at time 0")
    group.add_argument("--module", metavar="NAME",
                       help="which compiled module of an XLA dump folder (needed when it "
                            "holds several, in the runtime view; the buffers view defaults to "
                            "the one with the largest temp; `allocsim info DIR` lists them)")
    group.add_argument("--xla-view", choices=["runtime", "buffers"],
                       help="how an XLA dump becomes a trace: 'runtime' (default; `fidelity` "
                            "uses 'buffers'): the arguments, then per execution the temp and "
                            "the new outputs, as JAX's runtime asks its allocator; 'buffers': "
                            "one execution's logical buffers over their live ranges")
    group.add_argument("--steps", metavar="N",
                       help="executions of an XLA dump's module in the runtime view "
                            "(default 1)")
    group.add_argument("--allocator", metavar="NAME",
                       help="which allocator of a profiler trace (.xplane.pb) (default: the "
                            "one with the most records; `allocsim info FILE` lists them)")


def framework_argument(text: str) -> str:
    """argparse's ``type=`` for ``--framework``: the canonical name of any spelling
    (allocsim/frameworks.py); an unknown name is left as typed, for the command to refuse in
    its own line that names the ones it takes."""
    return canonical_framework(text) or text


def add_framework_option(parser: argparse.ArgumentParser, names: Sequence[str], *, help: str,
                         required: bool = False) -> None:
    """``--framework NAME`` with the same vocabulary on every command: the help lists the
    canonical ``names`` this command takes (``{pytorch,jax,cupy}``), and the other spellings
    (torch, tf) are aliases. Not argparse's ``choices``: a name the command does not take is
    refused by the command, in one line (:func:`check_framework`)."""
    parser.add_argument("--framework", type=framework_argument, required=required,
                        metavar="{" + ",".join(names) + "}", help=help)


def check_framework(name: str, names: Sequence[str], command: str) -> str:
    """``name`` (canonical already), if ``command`` takes it; else one line naming those it
    takes."""
    if name not in names:
        raise UserError(f"{command}: unknown framework {name!r}; known: {', '.join(names)}")
    return name


def load_trace(path: str, args: argparse.Namespace | None = None) -> Trace:
    """Load ``path`` (``default``: the bundled trace) with the reading options given on the
    command line."""
    path = resolve_trace_name(path)
    strict = getattr(args, "strict", None) or None
    device_index = getattr(args, "device_index", None)
    if isinstance(device_index, str) and is_whole_number(device_index):
        device_index = int(device_index)  # "1" means device 1; "cpu" / "cuda:1" stay text
    return formats.load(path, strict=strict, device_index=device_index,
                        module=getattr(args, "module", None),
                        view=getattr(args, "xla_view", None),
                        steps=getattr(args, "steps", None),
                        allocator=getattr(args, "allocator", None),
                        start_state=getattr(args, "start_state", None))


# argparse takes an argument that starts with "-" for an option unless it is a plain number
# (its matcher is ``^-\d+$|^-\d*\.\d+$``), so ``--capacity -5GiB`` or ``--tolerance -5%``
# ended in argparse's "expected one argument" usage block instead of reaching our check.
# No allocsim option looks like "-DIGIT", so every "-DIGIT..." can be taken as a value.
_DASH_DIGIT = re.compile(r"^-\.?\d")


def accept_dash_digit_values(parser: argparse.ArgumentParser) -> None:
    """Let option values on ``parser`` start with "-" and a digit (``-5GiB``, ``-5%``), so
    that the option's own check refuses them in one line."""
    if parser._has_negative_number_optionals:  # an option like "-1" exists: keep argparse's
        return
    parser._negative_number_matcher = _DASH_DIGIT


def int_argument(text: str) -> int:
    """argparse's ``type=`` for a whole number: ASCII digits after an optional "-" (``int``
    alone takes "٣"; allocsim/ascii_numbers.py)."""
    return whole_number(text.strip(), signed=True)


def float_argument(text: str) -> float:
    """argparse's ``type=`` for a real number written in ASCII."""
    return decimal_number(text.strip())


# argparse names the type in its one error line: "argument --top: invalid int value: '٣'".
int_argument.__name__ = "int"
float_argument.__name__ = "float"


def add_device_options(parser: argparse.ArgumentParser, *, capacity: bool = True,
                       purpose: str = "") -> None:
    """``--device NAME``, ``--capacity SIZE`` (unless the command finds the capacity itself)
    and ``--device-profile FILE``, with the same names and help on every command."""
    accept_dash_digit_values(parser)
    parser.add_argument("--device", metavar="NAME",
                        help=f"device profile{purpose} (default {DEFAULT_PROFILE}; see "
                             "`allocsim devices`)")
    if capacity:
        parser.add_argument("--capacity", metavar="SIZE",
                            help="device capacity, e.g. 24GiB (overrides the profile's)")
    parser.add_argument("--device-profile", metavar="FILE",
                        help="a device-profile JSON file (from `allocsim calibrate`)")
    parser.add_argument("--context", metavar="SIZE",
                        help="the device's own share: memory the CUDA context and libraries "
                             "hold before any allocator starts (default: the profile's, "
                             "`allocsim devices` shows it; none with --capacity)")


def capacity_option(text: str, option: str = "--capacity") -> int:
    """Bytes in a ``--capacity`` value, parsed and checked here, once: rounded down to a whole
    byte (with a note on stderr); a malformed size, or one out of :func:`check_capacity`'s
    range (zero, negative, past any device), is refused in one line that names the option."""
    try:
        nbytes, exact = parse_size_floor(text)
    except UserInputError as err:
        raise UserError(f"{option}: {err}") from None
    if not exact:
        # allocsim prints sizes such as 2.64GiB; typed back they are a fraction of a byte off.
        print(f"allocsim: note: {option} {text} is not a whole number of bytes; using "
              f"{nbytes:,} bytes (rounded down)", file=sys.stderr)
    try:
        return check_capacity(nbytes, option)
    except UserInputError as err:
        raise UserError(str(err)) from None


def device_from_args(args: argparse.Namespace) -> DeviceProfile:
    """The device the options of :func:`add_device_options` name: the named profile with
    ``--capacity`` and ``--context`` applied by :meth:`DeviceProfile.device_with` (its rule: a
    capacity is the allocators' memory, no context unless ``--context`` gives one)."""
    capacity = getattr(args, "capacity", None)
    nbytes = None if capacity is None else capacity_option(capacity)
    context = getattr(args, "context", None)
    share = None if context is None else context_option(context)
    device = named_profile(args.device, args.device_profile).device_with(nbytes, share)
    if share is not None:
        try:
            check_context(share, device.capacity)   # of the capacity it is a share of
        except UserInputError as err:
            raise UserError(str(err)) from None
    return device


def compiled_target(trace: Trace) -> tuple[str, int] | None:
    """``(target, device_memory_size)`` of a trace compiled for a GPU (compile_for), else
    None."""
    facts = trace.metadata.get("xla_gpu")
    if not isinstance(facts, dict) or not isinstance(facts.get("target"), str):
        return None
    return facts["target"], int(facts.get("device_memory_size") or 0)


def device_for_traces(args: argparse.Namespace, traces: list[Trace]) -> DeviceProfile:
    """The device of the options, for traces compiled for a GPU too: with no ``--device`` (or
    profile file) the target they were compiled for; a device whose memory disagrees with
    that target is one line (the compile assumed the target's memory: its schedulers read
    it)."""
    targets = {t for t in (compiled_target(trace) for trace in traces) if t is not None}
    if (len(targets) == 1 and args.device is None and getattr(args, "device_profile", None)
            is None):
        (name, _), = targets
        if name in PROFILES:
            args = argparse.Namespace(**{**vars(args), "device": name})
    device = device_from_args(args)
    for name, memory in sorted(targets):
        base = device.name
        profile_memory = PROFILES[base].capacity if base in PROFILES else device.profile_capacity
        if memory and memory != profile_memory:
            raise UserError(f"--device {base}: the trace was compiled for {name} "
                            f"({format_size(memory)}), not this device "
                            f"({format_size(profile_memory)}); compile for {base} or give "
                            f"--device {name}")
    return device


def size_option(text: str, option: str) -> int:
    """Bytes in the value of a size option (``--resolution``, ``--sizes``, ...): a malformed
    size, or a number of more digits than any size has, is refused in one line that names the
    option."""
    try:
        return parse_size(text)
    except UserInputError as err:
        raise UserError(f"{option}: {err}") from None


def context_option(text: str, option: str = "--context") -> int:
    """Bytes in a ``--context`` value (0 allowed: no share)."""
    nbytes = size_option(text, option)
    if nbytes < 0:
        raise UserError(f"{option}: must be a size >= 0, e.g. 512MiB or 0; got {text!r}")
    return nbytes


def tolerance_option(text: str, option: str = "--tolerance") -> float:
    """A relative slack, "1%" or "0.01" (= 1%); refused in one line unless a number >= 0."""
    body = text.strip()
    percent = body.endswith("%")
    try:
        value = float(body[:-1] if percent else body)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{option}: must be a relative slack >= 0, e.g. 1% or 0.01; got {text!r}")
    return value / 100 if percent else value


def max_slowdown_option(value: float, option: str = "--max-slowdown") -> float | None:
    """The slowdown budget (None for ``inf``, no budget); refused in one line unless >= 1."""
    if math.isnan(value) or value < 1:
        raise UserError(f"{option}: must be a factor >= 1 (e.g. 1.1) or inf for no budget; "
                        f"got {value:g}")
    return None if math.isinf(value) else value


def workers_option(value: int | None, option: str = "--workers") -> int | None:
    """A number of worker processes (None: the default); refused in one line unless >= 1."""
    if value is not None and value < 1:
        raise UserError(f"{option}: must be a number of processes >= 1; got {value}")
    return value


def progress_printer(enabled: bool) -> Callable[[str, int, int], None] | None:
    """A progress line on stderr for long replays (only when stderr is a terminal)."""
    if not enabled:
        return None

    def show(policy: str, done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        sys.stderr.write(f"\r  {policy}: {done:,}/{total:,} events ({done / max(total, 1):.0%})"
                         + end)
        sys.stderr.flush()
    return show


# The most often a plain progress line is printed: anything past two seconds says what it is
# doing (issue 37), and a log still gets a line every few seconds, not one per event.
PROGRESS_INTERVAL_S = 2.0


class PlainProgress:
    """Progress of long work for a log (stderr not a terminal): a plain line, no carriage
    return, at most every :data:`PROGRESS_INTERVAL_S` seconds, such as
    ``allocsim: min-capacity: searching bfc (policy 2/4), 12 s``.

    Used as a context manager around the work: :meth:`update` names the current step (and
    prints it when the last line is ``interval`` seconds old); while the work is silent, a
    background timer repeats the current step every ``interval`` seconds. Work that ends
    within the first ``interval`` prints nothing at all (so quick commands, and their one-line
    errors, stay as they were); longer work ends with ``allocsim: CMD: done in 69 s``.
    Disabled (``enabled=False``) it does nothing. Lines go to stderr only, so ``--json`` on
    stdout stays clean.
    """

    def __init__(self, command: str, *, enabled: bool = True, interval: float | None = None,
                 stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.command = command
        self.enabled = enabled
        self.interval = PROGRESS_INTERVAL_S if interval is None else max(0.0, interval)
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.step = "working"
        self.lines = 0
        self._start = self._last = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    def elapsed(self) -> float:
        return self.clock() - self._start

    def _line(self, text: str) -> None:
        self.stream.write(f"allocsim: {self.command}: {text}\n")
        self.stream.flush()
        self.lines += 1
        self._last = self.clock()

    def _due(self) -> bool:
        return self.clock() - self._last >= self.interval

    def update(self, step: str) -> None:
        """The work is at ``step`` now; printed if the last line is old enough."""
        if not self.enabled:
            return
        with self._lock:
            self.step = step
            if self._due():
                self._line(f"{step}, {self.elapsed():.0f} s")

    def _tick(self) -> None:
        while not self._stop.wait(max(0.05, self.interval - (self.clock() - self._last))):
            with self._lock:
                if self._due() and not self._stop.is_set():
                    self._line(f"{self.step}, {self.elapsed():.0f} s")

    def __enter__(self) -> PlainProgress:
        self._start = self._last = self.clock()
        if self.enabled and self.interval > 0:
            self._timer = threading.Thread(target=self._tick, name="allocsim-progress",
                                           daemon=True)
            self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
        if self.enabled and kind is None and self.lines:
            with self._lock:
                self._line(f"done in {self.elapsed():.0f} s")


class TerminalProgress:
    """Progress of long work on a terminal: one status line, rewritten in place (``\\r``) at
    most ten times a second and cleared at the end, so the command's own output follows on a
    clean line. The same interface as :class:`PlainProgress`."""

    REDRAW_S = 0.1

    def __init__(self, command: str, *, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.command = command
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock
        self.lines = 0
        self._last = -math.inf
        self._shown = False

    def update(self, step: str) -> None:
        now = self.clock()
        if now - self._last < self.REDRAW_S:
            return
        self._last = now
        self.stream.write(f"\r\x1b[K  {self.command}: {step}")
        self.stream.flush()
        self.lines += 1
        self._shown = True

    def __enter__(self) -> TerminalProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def command_progress(command: str, *, enabled: bool = True) -> PlainProgress | TerminalProgress:
    """Progress for a command's slow steps (reading, replaying, writing): a status line on a
    terminal, plain lines every :data:`PROGRESS_INTERVAL_S` seconds on a log; nothing when
    ``enabled`` is false (``--json``'s stdout stays clean either way: progress is stderr)."""
    if enabled and sys.stderr.isatty():
        return TerminalProgress(command)
    return PlainProgress(command, enabled=enabled)


def replay_reporter(progress: PlainProgress | TerminalProgress, trace_name: str,
                    policies: int) -> Callable[[str, int, int], None]:
    """A replay's progress callback (policy, events done, events in all) that names the
    trace, the policy and how far it is."""
    seen: list[str] = []

    def report(policy: str, done: int, total: int) -> None:
        if not seen or seen[-1] != policy:
            seen.append(policy)
        progress.update(f"replaying {trace_name}: {policy} (policy {len(seen)}/{policies}, "
                        f"{done / max(total, 1):.0%} of {total:,} events)")
    return report


def plain_progress(command: str, *, enabled: bool = True) -> PlainProgress:
    """A :class:`PlainProgress` for ``command`` that prints only when stderr is not a
    terminal (on a terminal the command's own live lines are used, or none)."""
    return PlainProgress(command, enabled=enabled and not sys.stderr.isatty())


OUTPUT_OPTIONS = ("-o", "--out", "--output")


def add_output_option(parser: argparse.ArgumentParser, *, dest: str, metavar: str, help: str,
                      required: bool = False, default: str | None = None) -> None:
    """The one spelling of "where to write" on every command that writes: ``-o``, ``--out``
    and ``--output`` are the same option everywhere (a FILE or a DIR, as ``metavar`` says), so
    a user never has to remember which command takes which."""
    parser.add_argument(*OUTPUT_OPTIONS, dest=dest, metavar=metavar, help=help,
                        required=required, default=default)


def ensure_parent(path: str) -> None:
    """The one rule for output paths on the command line: a missing folder is created (as
    ``--out DIR`` is), so ``gen``, ``convert``, ``report`` and ``export-snapshot`` agree."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)


def check_output_folder(path: str | os.PathLike[str], *, folder: bool = False) -> None:
    """Refuse, in one line and before any work, an output that could not be written: a FILE
    (``folder=False``) whose folder must exist, as the trace writers want it, or a DIR
    (``folder=True``), made where missing, so the nearest folder above it that exists must
    take it. A file or a dangling link where a folder must be is refused. The folder is tried
    as the atomic writer will use it: a temporary file made there and removed at once (a
    read-only folder or file system, another user's folder; root passes where root may
    write). Nothing is left behind, nothing is made."""
    given = printable(os.fspath(path))
    target = Path(path).absolute()

    def shown(where: Path) -> str:   # as the path was given: relative where it was
        if not Path(path).is_absolute():
            try:
                return printable(os.path.relpath(where))
            except ValueError:      # another drive (Windows)
                pass
        return printable(os.fspath(where))

    if folder:
        if (target.exists() or target.is_symlink()) and not target.is_dir():
            raise UserError(f"{given}: not a folder (a file of that name exists)")
        probe = target
        while not probe.is_dir():   # the nearest folder that exists: the rest would be made
            if probe.exists() or probe.is_symlink():
                raise UserError(f"{given}: {shown(probe)} is not a folder")
            probe = probe.parent
    else:
        probe = target.parent
        if not probe.is_dir():
            if probe.exists() or probe.is_symlink():
                raise UserError(f"{given}: {shown(probe)} is not a folder")
            raise UserError(f"{given}: the folder {shown(probe)} does not exist")
    try:
        fd, name = tempfile.mkstemp(prefix=".allocsim-check.", suffix=".tmp", dir=probe)
    except OSError as err:
        raise UserError(f"{given}: cannot write into {shown(probe)}: "
                        f"{err.strerror or err}") from None
    os.close(fd)
    try:
        os.unlink(name)
    except OSError:
        pass


# What the examples run on: the bundled samples, as a checkout holds them.
TORCH_SAMPLE = "traces/data/sample-torch-cpu-mlp.npz"
JAX_SAMPLE = "traces/data/sample-jax-cpu-train.npz"


def examples(*commands: str) -> str:
    """The end of every command's ``--help``: ``examples:`` and 1 to 3 real commands that run
    on what a checkout holds (``a && b`` for one that needs another's output first)."""
    return "examples:\n" + "\n".join(f"  {command}" for command in commands)


def print_written(paths: Sequence[str | os.PathLike[str]], detail: str = "", *,
                  to_stderr: bool = False) -> None:
    """The one line every command prints for what it wrote: ``wrote PATH[, PATH ...][:
    detail]``, each name escaped (allocsim/printable.py) as it was given (``out/tune.json``).
    ``to_stderr`` where standard output carries JSON (``--json``) or the answer comes after
    it, so that standard output stays what it promises."""
    line = "wrote " + ", ".join(printable(os.fspath(path)) for path in paths)
    print(line + (f": {detail}" if detail else ""), file=sys.stderr if to_stderr else sys.stdout)


def print_json(data: Any) -> None:
    """One JSON document on stdout, keys in schema order, as every ``--json`` prints."""
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")
