"""The one small interface every allocator model implements, and the device it draws from.

A policy is a pure state machine: ``malloc(size, stream) -> address | None`` and
``free(address)``. It takes memory from a device through the calls of :class:`DeviceMemory`
(cudaMalloc-style ``reserve``/``release``, and the CUDA virtual-memory calls
``address_range``/``map``/``unmap`` for heaps that grow in place). It never sleeps, counts
time, opens files or imports the engine: the same object can therefore be driven by the
simulator or, through a CuPy-backed device, by the validator on a real GPU.

Who counts what: the device counts the bytes a policy actually took (reserved); the engine
counts live requested bytes from the trace (allocated). A policy's own :class:`PolicyStats`
(bytes after rounding, largest free block, …) are for diagnosis only, so a buggy policy cannot
flatter its own headline numbers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, NoReturn, Protocol


class DeviceMemory(Protocol):
    """What a policy may ask of the device. Addresses are plain ints.

    ``reserve``/``release`` are cudaMalloc/cudaFree: virtual range and physical memory together.
    ``busy`` charges work with no memory in it (a TPU runtime's compaction).
    ``address_range``/``map``/``unmap`` are the virtual-memory calls (cuMemAddressReserve,
    cuMemCreate+cuMemMap, cuMemUnmap+cuMemRelease): a range costs no memory until pages are
    mapped into it, in multiples of ``map_granularity``.
    """

    capacity: int
    map_granularity: int

    def reserve(self, nbytes: int) -> int | None: ...

    def release(self, base: int) -> None: ...

    def address_range(self, nbytes: int) -> int: ...

    def map(self, address: int, nbytes: int) -> bool: ...

    def unmap(self, address: int, nbytes: int) -> None: ...

    def busy(self, kind: str, nbytes: int, seconds: float) -> None:
        """Work the device does for the process with no memory taken or given (the TPU
        runtime's compaction: ``nbytes`` copied within HBM), charged as one call of ``kind``
        that costs ``seconds``."""
        ...


@dataclass(frozen=True)
class Param:
    """One constructor parameter of a policy: its kind (size, bool, int, float), default, help."""

    kind: str
    default: Any
    help: str


def params_of(init: Callable[..., None], **declared: tuple[str, str]) -> dict[str, Param]:
    """A policy's ``PARAMS``: ``name=(kind, help)`` for each constructor parameter, the default
    read off ``init``'s signature, the one place defaults are written (scikit-learn reads an
    estimator's parameters off ``__init__`` the same way). Called in the class body right after
    ``__init__``. Every parameter of ``init`` but ``self`` and ``device`` must be declared, and
    nothing else; the order of ``declared`` is the order specs and listings show.
    """
    parameters = inspect.signature(init).parameters
    names = [name for name in parameters if name not in ("self", "device")]
    if sorted(names) != sorted(declared):
        raise TypeError(f"{init.__qualname__}: parameters {names} but declared "
                        f"{list(declared)}")
    missing = [name for name in names if parameters[name].default is inspect.Parameter.empty]
    if missing:
        raise TypeError(f"{init.__qualname__}: parameters without a default: {missing}")
    return {name: Param(kind, parameters[name].default, text)
            for name, (kind, text) in declared.items()}


# How a policy's decisions depend on the device's capacity: the kinds a policy declares in its
# ``capacity_use`` (see :class:`CapacityUse`; min-capacity's shortcuts, issue 17).
CAPACITY_UNKNOWN = "unknown"          # anything may depend on it (the safe default)
CAPACITY_LIMIT = "limit"              # only the device's answers to its calls
CAPACITY_LIMIT_FATAL = "limit-fatal"  # only those, and a refused call fails its request
CAPACITY_BFC_REGIONS = "bfc-regions"  # BFC's rule: memory_limit sizes the regions
CAPACITY_KINDS = (CAPACITY_UNKNOWN, CAPACITY_LIMIT, CAPACITY_LIMIT_FATAL, CAPACITY_BFC_REGIONS)


@dataclass(frozen=True)
class CapacityUse:
    """How a policy's decisions depend on the device's capacity, declared from its own rules,
    so that ``min-capacity`` can answer "does the trace complete at capacity c?" from replays
    it already ran (allocsim.sim.questions.capacity.oracle holds each kind's argument).

    A policy class declares it in its body as one line of text, ``capacity_use = "KIND"`` or
    ``"KIND; unless P, Q"``: parameters that void the claim when a spec sets them (the policy
    is then ``unknown``). The kinds:

    - ``unknown`` (the default): no claim. min-capacity watches whether the policy reads
      ``device.capacity`` at all and otherwise replays every capacity it asks about.
    - ``limit``: the capacity reaches the policy's decisions only through the device's answers
      to its calls (a call is refused when the memory in use plus the call's bytes exceed the
      capacity). Reading ``capacity`` is allowed where no decision follows from it (a virtual
      range as large as the device, a limit compared only when some option is set). Two
      capacities at which the device answers every call of a run alike give the same run.
    - ``limit-fatal``: ``limit``, and a refused call always fails the request it serves (no
      release-and-retry, no smaller fallback).
    - ``bfc-regions``: BFC's rules (policies/bfc.py): ``memory_limit`` (a share of the
      capacity, or given) decides only Extend — a region of min(doubling size, limit − pool
      rounded down to 256 B), a failure when the request exceeds that — besides the device's
      answers; everything between two Extends is capacity-blind. Holds without garbage
      collection and with the fixed 128 MiB split threshold.

    A declaration is the class's own and is not inherited (:func:`capacity_use_of`): a subclass
    that changes a rule must declare again. tests/test_capacity_claims.py holds every
    declaration to real replays.
    """

    kind: str = CAPACITY_UNKNOWN
    unless: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> CapacityUse:
        """``"KIND"`` or ``"KIND; unless P, Q"`` as a CapacityUse; ValueError if malformed."""
        kind, _, rest = (part.strip() for part in text.partition(";"))
        if kind not in CAPACITY_KINDS:
            raise ValueError(f"capacity use {kind!r} is none of {', '.join(CAPACITY_KINDS)}")
        if not rest:
            return cls(kind)
        head, _, names = rest.partition(" ")
        unless = tuple(name.strip() for name in names.split(",") if name.strip())
        if head != "unless" or not unless:
            raise ValueError(f"capacity use {text!r}: expected '; unless NAME, ...' after the "
                             "kind")
        return cls(kind, unless)

    def resolve(self, params: Mapping[str, Any]) -> str:
        """The kind for a policy built with ``params`` (the parameters a spec sets: those that
        differ from the defaults)."""
        return CAPACITY_UNKNOWN if any(name in params for name in self.unless) else self.kind


def capacity_use_of(cls: type[Policy], params: Mapping[str, Any]) -> str:
    """The capacity use ``cls`` declares in its own body, for a spec setting ``params``;
    ``unknown`` for a class that declares none (a declaration is not inherited). ValueError
    for a declaration that cannot be read or names a parameter the class does not have."""
    text = cls.__dict__.get("capacity_use")
    if not isinstance(text, str):
        return CAPACITY_UNKNOWN
    declared = CapacityUse.parse(text)
    strangers = [name for name in declared.unless if name not in cls.PARAMS]
    if strangers:
        raise ValueError(f"{cls.__name__}.capacity_use names unknown parameters {strangers}")
    return declared.resolve(params)


# The native core's arithmetic on sizes is int64 (rounding and doubling included): a setting at
# or beyond this size keeps a run on the Python models, with their unbounded ints.
NATIVE_SIZE_LIMIT = 1 << 60


@dataclass(frozen=True)
class NativeTwin:
    """A policy's twin in the native core (native/src/), declared in the policy's own body as
    ``native = NativeTwin(...)`` and not inherited (:func:`native_twin_of`): a subclass that
    changes a rule has no twin until it declares one.

    ``family`` names the code of the core that replays the policy (the table of families in
    native/src/module.cpp); ``header`` the file of native/src/ that mirrors the policy's
    module rule for rule, by name (``policies/X.py`` and ``X.hpp``); ``settings`` says in words
    what the core has of the policy (``allocsim policies``). The numbers the core is handed
    come from the policy itself, :meth:`Policy.native_config`, so the twins cannot drift.
    """

    family: str
    header: str
    settings: str = "every setting"


def native_twin_of(cls: type[Policy]) -> NativeTwin | None:
    """The native twin ``cls`` declares in its own body, or None (none declared here)."""
    twin = cls.__dict__.get("native")
    return twin if isinstance(twin, NativeTwin) else None


@dataclass
class PolicyStats:
    """The one stats shape every policy fills the same way (diagnostics, not headline figures).

    ``bytes_in_use`` counts blocks handed out after rounding, unsplit slack included (BFC's and
    PyTorch's "allocated"); ``bytes_requested`` what callers asked for; ``pool_bytes`` what the
    policy believes it holds from the device; ``largest_free_block`` the biggest free block
    inside that pool.
    """

    num_allocs: int = 0
    num_frees: int = 0
    num_ooms: int = 0
    bytes_in_use: int = 0
    peak_bytes_in_use: int = 0
    bytes_requested: int = 0
    pool_bytes: int = 0
    peak_pool_bytes: int = 0
    largest_free_block: int = 0
    free_blocks: int = 0
    # A policy's own counters beyond these (the tpu's compactions), after them in as_dict().
    extra: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        fixed = asdict(self)
        del fixed["extra"]
        return {**fixed, **self.extra}


class Policy:
    """Base class of allocator models. Subclasses set ``name``, ``PARAMS``, ``description``
    and, where they can say it from their rules, ``capacity_use`` (:class:`CapacityUse`).

    Constructor-only parameters (scikit-learn style): ``Policy(device, **params)``; the
    registry in :mod:`allocsim.policies.registry` turns a spec string into that call, and
    ``PARAMS`` is built with :func:`params_of` from ``__init__``'s own defaults. Subclasses
    override :meth:`check` with their invariants.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    PARAMS: ClassVar[dict[str, Param]] = {}
    # How decisions depend on the device's capacity: CapacityUse's one-line text, declared by
    # each class in its own body (not inherited); "unknown" promises nothing.
    capacity_use: ClassVar[str] = CAPACITY_UNKNOWN
    # The policy's twin in the native core (:class:`NativeTwin`), declared by each class in its
    # own body (not inherited); None: the Python model is the only implementation.
    native: ClassVar[NativeTwin | None] = None

    def __init__(self, device: DeviceMemory) -> None:
        self.device = device
        # Kept current by every policy on the hot path; read by the engine at peaks.
        self.bytes_in_use = 0
        self.num_allocs = 0
        self.num_frees = 0
        self.num_ooms = 0

    # -- the interface ---------------------------------------------------------------
    def malloc(self, size: int, stream: int = 0) -> int | None:
        """Address of a block of at least ``size`` bytes (size > 0), or None when out of memory."""
        raise NotImplementedError

    def free(self, address: int) -> None:
        """Give back the block that ``malloc`` returned at ``address``."""
        raise NotImplementedError

    def blocks(self) -> Iterator[tuple[int, int, bool]]:
        """Every block the policy manages as ``(address, size, in_use)``, for checks and plots."""
        raise NotImplementedError

    def stats(self) -> PolicyStats:
        raise NotImplementedError

    def native_config(self) -> dict[str, Any] | None:
        """What the native core is handed to replay this freshly built policy: its family
        (:class:`NativeTwin`) and :meth:`native_numbers`; None when the core cannot replay it
        (the class declares no twin, or its settings exceed the core's int64 arithmetic)."""
        twin = native_twin_of(type(self))
        if twin is None:
            return None
        numbers = self.native_numbers()
        return None if numbers is None else {"family": twin.family, **numbers}

    def native_numbers(self) -> dict[str, Any] | None:
        """The constants and settings the native twin takes (its config struct's fields, read
        off this policy so they cannot drift); None when a setting exceeds what the core can
        hold (:data:`NATIVE_SIZE_LIMIT`). A policy with a twin overrides this."""
        return {}

    def empty_cache(self) -> None:
        """Return every wholly free piece of memory to the device (no-op where nothing is
        cached)."""

    def check(self) -> None:
        """Assert the policy's own invariants; raise AssertionError naming the one broken.

        Executable validity checks in the manner of sortedcontainers' ``_check`` and mimalloc's
        ``mi_page_is_valid``: each policy overrides this with the invariants of its structures
        (links, free indexes, merge rules) and its counters against a recount. It costs O(n) or
        more, so it is for tests and debugging (tests/policy_checks.py calls it after every
        event) and never runs on the replay path. Raises explicitly rather than with ``assert``
        so that ``python -O`` cannot strip it. The default checks nothing.
        """


def fail(invariant: str) -> NoReturn:
    """Raise the AssertionError of a broken invariant (shared by every ``check()``)."""
    raise AssertionError(f"invariant broken: {invariant}")


def require(condition: bool, invariant: str) -> None:
    """``check()``'s assert, kept under ``python -O``: fail with ``invariant`` unless
    ``condition``."""
    if not condition:
        fail(invariant)


def check_live_chunks(owner: str, policy: Policy, requested: dict[int, int],
                      in_use: Mapping[int, object], size_of: Mapping[int, int]) -> None:
    """The accounting every chunk-handing policy keeps (CuPy's pool, the stream-ordered
    pool): a request per live chunk, never more than its chunk, ``bytes_in_use`` the live
    chunks' sizes, allocs − frees their number. ``owner`` prefixes each message."""
    require(requested.keys() == in_use.keys(),
            f"{owner}: the requested table is not the chunks in use")
    for address, size in requested.items():
        if not 0 < size <= size_of[address]:
            fail(f"{owner}: chunk {address:#x} holds less than its request of {size}")
    require(policy.bytes_in_use == sum(size_of[a] for a in in_use),
            f"{owner}: bytes_in_use is not the chunks in use")
    require(policy.num_allocs - policy.num_frees == len(in_use),
            f"{owner}: allocs − frees is not the number of live chunks")

