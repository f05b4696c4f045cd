"""A corpus of bad inputs, one per class of defect found by trying allocsim as a new user:
each ends in one line ``allocsim: error: FILE: ...``, exit status 2, no traceback, and the
folder is left exactly as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocsim.sim.cli.main import main


def memory_event(**args: object) -> dict[str, object]:
    fields = {"Addr": 16, "Bytes": 64, "Total Allocated": 64, "Total Reserved": 64,
              "Device Type": 0, "Device Id": -1}
    fields.update(args)
    return {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
            "s": "t", "ts": 1.0, "args": fields}


def chrome(*events: dict[str, object]) -> str:
    return json.dumps({"traceEvents": list(events)})


RMM_HEAD = "Thread,Time,Action,Pointer,Size,Stream\n"
CORPUS = {
    # numbers a format cannot hold
    "bytes-2^64.json": (chrome(memory_event(Bytes=2**64)), "does not fit in 64 bits"),
    "bytes-1e300.json": (chrome(memory_event(Bytes=1e300)), "does not fit in 64 bits"),
    "ts-nan.json": (chrome(memory_event()).replace('"ts": 1.0', '"ts": NaN'), "event ts nan"),
    "bytes-inf.json": (chrome(memory_event()).replace('"Bytes": 64', '"Bytes": Infinity'),
                       "is not an integer"),
    "size-2^64.rmm.csv": (RMM_HEAD + f"1,0.1,allocate,0x10,{2**64},0x0\n",
                          "does not fit in 64 bits"),
    "pointer-2^64.rmm.csv": (RMM_HEAD + f"1,0.1,allocate,{2**64:#x},64,0x0\n",
                             "does not fit in 64 bits"),
    "size-2^64.log": (json.dumps({"hook": "malloc", "device_id": 0, "size": 2**64,
                                  "mem_size": 512, "mem_ptr": 4096, "pmem_id": "0x1"}) + "\n",
                      "does not fit in 64 bits"),
    "size-2^64.rep": (f"20000\n1\n1\n1\na 0 {2**64}\n", "does not fit in 64 bits"),
    # nesting
    "nested.json": ('{"traceEvents":' + "[" * 100_000 + "]" * 100_000 + "}",
                    "nested too deeply"),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
@pytest.mark.parametrize("command", ["info", "compare"])
def test_a_bad_input_is_one_line_exit_2_and_nothing_changes(tmp_path: Path, capsys, name: str,
                                                          command: str) -> None:
    text, problem = CORPUS[name]
    path = tmp_path / name
    path.write_text(text)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    argv = [command, str(path)] + (["--policies", "bfc"] if command == "compare" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"allocsim: error: {path}") and err.count("\n") == 1, err
    assert problem in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_compression_bomb_is_refused_before_it_fills_memory(tmp_path: Path, capsys,
                                                              monkeypatch) -> None:
    import gzip
    monkeypatch.setenv("ALLOCSIM_MAX_INPUT_BYTES", str(1 << 20))
    bomb = tmp_path / "bomb.csv.gz"
    # 64 MiB of CSV rows in a file of a few hundred KiB
    row = b"0,alloc,1,64\n"
    bomb.write_bytes(gzip.compress(b"time_ns,op,id,size\n" + row * ((64 << 20) // len(row))))
    assert main(["info", str(bomb)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ALLOCSIM_MAX_INPUT_BYTES" in err
    assert "decompresses to more than 1,048,576 bytes" in err
    big = tmp_path / "big.csv"
    big.write_bytes(b"time_ns,op,id,size\n" + row * 100_000)
    assert main(["info", str(big)]) == 2
    assert "the file holds more than" in capsys.readouterr().err
