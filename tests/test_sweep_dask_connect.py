"""``--executor dask://HOST:PORT`` at something that is not a Dask scheduler, or at no address
at all, is one line, soon (issue 36.7): a server that says nothing hung sweep and tune, one that
sends bytes of its own had them read as the length of a message to allocate (3.07 EiB), and
``dask://a b`` was a traceback. Needs Dask's distributed (the optional ``dask`` extra)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="Dask's distributed is an optional extra "
                                          "(pip install -e '.[dask]')")

from allocsim.sim.cli.main import main
from allocsim.sim.sweeps import executors
from allocsim.sim.sweeps.grid import SweepError
from allocsim.sim.sweeps.run import run_sweep
from allocsim.traces import formats, synth


@pytest.fixture
def sweep_file(tmp_path: Path) -> Path:
    formats.save(synth.generate("random", seed=1, events=200), tmp_path / "r.npz")
    path = tmp_path / "s.toml"
    path.write_text('name = "s"\noutput = "out/results.jsonl"\n[grid]\ntraces = ["r.npz"]\n'
                    'policies = ["bfc"]\n')
    return path


def serving(greeting: bytes | None) -> Iterator[str]:
    """A local TCP server that sends ``greeting`` on each connection (None: says nothing) and
    holds it open; yields its dask:// address."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if greeting is not None:
                conn.sendall(greeting)

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"dask://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for conn in held:
            conn.close()


@pytest.fixture
def garbage() -> Iterator[str]:
    yield from serving(b"\xff" * 64)


@pytest.fixture
def web_server() -> Iterator[str]:
    yield from serving(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


@pytest.fixture
def silent() -> Iterator[str]:
    yield from serving(None)


def test_a_server_sending_garbage_is_not_a_scheduler(sweep_file, garbage) -> None:
    with pytest.raises(SweepError, match="is not a Dask scheduler") as err:
        run_sweep(sweep_file, executor=garbage, progress=False)
    assert "\n" not in str(err.value) and garbage[len("dask://"):] in str(err.value)


def test_a_web_server_is_not_a_scheduler(sweep_file, web_server) -> None:
    """Its "HTTP/1.1" read as a message length is 3.5e18 bytes: refused, never allocated."""
    with pytest.raises(SweepError, match="is not a Dask scheduler"):
        run_sweep(sweep_file, executor=web_server, progress=False)


def test_a_silent_server_is_given_up_on_after_the_connect_timeout(sweep_file, silent,
                                                                  monkeypatch) -> None:
    monkeypatch.setattr(executors, "DASK_CONNECT_TIMEOUT_S", 0.5)
    with pytest.raises(SweepError, match=r"did not answer as a Dask scheduler within 0\.5 s"):
        run_sweep(sweep_file, executor=silent, progress=False)


@pytest.mark.parametrize("address, problem", [
    ("dask://a b", "missing port number"),
    ("dask://127.0.0.1:notaport", "notaport"),
    ("dask://127.0.0.1:70000", "port 70000 is not from 1 to 65535"),
])
def test_a_bad_address_is_one_line(sweep_file, capsys, address, problem) -> None:
    status = main(["sweep", str(sweep_file), "--executor", address])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and problem in err and address in err, err


def test_tune_says_the_same_in_one_line(sweep_file, garbage, capsys) -> None:
    status = main(["tune", str(sweep_file.parent / "r.npz"), "--framework", "pytorch",
                   "--device", "a100-40g",
                   "--executor", garbage])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "is not a Dask scheduler" in err, err
