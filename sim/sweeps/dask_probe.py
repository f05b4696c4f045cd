"""Is a Dask scheduler at this address? Asked before Dask's client connects (issue 36.7).

distributed's client, pointed at something that is not a scheduler, waits on a server that
says nothing past its own timeout, and reads the first eight bytes of one that says something
else as the length of a message to allocate ("HTTP/1.1" is 3.5e18 bytes). A scheduler speaks
first: on accepting a connection it writes its handshake (``Listener.on_connection``), one small
message framed as every message of Dask's TCP comm is, an 8-byte length and then that many
bytes (distributed/comm/tcp.py). So: connect, read that message within a deadline, and refuse a
length no handshake has, before distributed reads anything.
"""

from __future__ import annotations

import socket
import struct
import time

from allocsim.sim.sweeps.grid import SweepError

__all__ = ["check_scheduler"]

# A scheduler's handshake is a few hundred bytes (its compression and pickle protocol); a
# length past this is not one, and is never allocated.
HANDSHAKE_MOST = 64 << 10
_LENGTH = struct.Struct("Q")      # as distributed's TCP comm frames a message


def check_scheduler(given: str, address: str, timeout: float) -> None:
    """Raise one-line :class:`SweepError` (naming the executor as ``given``) unless a Dask
    scheduler greets us at ``address`` (``tcp://HOST:PORT``) within ``timeout`` seconds.
    ``tls://`` is only parsed: its greeting comes inside TLS, and is left to the client's own
    timeout."""
    from distributed.comm import parse_address, parse_host_port

    try:
        scheme, location = parse_address(address)
        host, port = parse_host_port(location)
        if not 0 < port < 1 << 16:
            raise ValueError(f"port {port} is not from 1 to 65535")
    except ValueError as err:
        raise SweepError(f"--executor {given!r} is not a Dask scheduler's address "
                         f"(dask://HOST:PORT): {err}") from None
    if scheme != "tcp":
        return
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            length = _LENGTH.unpack(_read(conn, _LENGTH.size, deadline))[0]
            if length > HANDSHAKE_MOST:
                raise SweepError(f"{given} is not a Dask scheduler: its first message "
                                 f"claims {length:,} bytes (a scheduler's greeting is a few "
                                 "hundred)")
            _read(conn, length, deadline)
    except TimeoutError:
        raise SweepError(f"{given} did not answer as a Dask scheduler within {timeout:g} s"
                         ) from None
    except ConnectionError as err:
        raise SweepError(f"{given} is not a Dask scheduler: {err}") from None
    except OSError as err:
        raise SweepError(f"cannot reach the Dask scheduler at {given}: "
                         f"{err.strerror or err}") from None


def _read(conn: socket.socket, count: int, deadline: float) -> bytes:
    """``count`` bytes from ``conn`` before ``deadline``; TimeoutError past it."""
    data = bytearray()
    while len(data) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        conn.settimeout(left)
        piece = conn.recv(min(count - len(data), 1 << 16))
        if not piece:
            raise ConnectionError("it closed the connection before greeting")
        data += piece
    return bytes(data)
