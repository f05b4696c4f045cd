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
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, NoReturn, Protocol


class DeviceMemory(Protocol):
    """What a policy may ask of the device. Addresses are plain ints.

    ``reserve``/``release`` are cudaMalloc/cudaFree: virtual range and physical memory together.
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

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Policy:
    """Base class of allocator models. Subclasses set ``name``, ``PARAMS``, ``description``.

    Constructor-only parameters (scikit-learn style): ``Policy(device, **params)``; the
    registry in :mod:`allocsim.policies.registry` turns a spec string into that call, and
    ``PARAMS`` is built with :func:`params_of` from ``__init__``'s own defaults. Subclasses
    override :meth:`check` with their invariants.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    PARAMS: ClassVar[dict[str, Param]] = {}

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

