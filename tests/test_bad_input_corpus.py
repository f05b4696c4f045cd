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
    "pointer-negative.rmm.csv": (RMM_HEAD + "1,0.1,allocate,-0x10,64,0x0\n"
                                 "1,0.2,free,-0x10,64,0x0\n", "Pointer '-0x10' is not a hex"),
    "pointer-underscore.rmm.csv": (RMM_HEAD + "1,0.1,allocate,0x_10,64,0x0\n",
                                   "Pointer '0x_10' is not a hex"),
    "size-2^63-1.log": (json.dumps({"hook": "malloc", "device_id": 0, "size": 2**63 - 1,
                                    "mem_size": 2**63 - 1, "mem_ptr": 4096,
                                    "pmem_id": "0x1"}) + "\n",
                        "rounds up to CuPy's 512-byte unit past 64 bits"),
    "mem-size-below-size.log": (json.dumps({"hook": "malloc", "device_id": 0, "size": 1024,
                                            "mem_size": 512, "mem_ptr": 4096,
                                            "pmem_id": "0x1"}) + "\n",
                                "mem_size 512 is smaller than the size 1024"),
    # nesting
    "nested.json": ('{"traceEvents":' + "[" * 100_000 + "]" * 100_000 + "}",
                    "nested too deeply"),
    # a field past the csv module's limit (_csv.Error), rows no trace has
    "field-5MB.csv": ('time_ns,op,id,size\n0,alloc,1,"' + "6" * 5_000_000 + '"\n',
                      "line 2: longer than 131,072 bytes"),
    "field-5MB.rmm.csv": (RMM_HEAD + '1,0.1,allocate,0x10,"' + "6" * 5_000_000 + '",0x0\n',
                          "line 2: longer than 131,072 bytes"),
    "quoted-lines.csv": ('time_ns,op,id,size\n0,alloc,1,"' + ("6" * 1000 + "\n") * 200
                         + '"\n', "unreadable CSV: field larger than field limit (131072)"),
    "line-200KB.jsonl": (json.dumps({"time_ns": 0, "op": "alloc", "id": 1, "size": 64,
                                     "tag": "x" * 200_000}) + "\n",
                         "line 1: longer than 131,072 characters"),
    # text that cannot be printed: a lone surrogate
    "surrogate-tag.jsonl": ('{"time_ns": 0, "op": "alloc", "id": 1, "size": 64, '
                            '"tag": "\\ud800"}\n', "tag '\\ud800' is not text"),
    "surrogate-name.jsonl": ('{"allocsim-metadata": {"name": "\\udfff"}}\n'
                             '{"time_ns": 0, "op": "alloc", "id": 1, "size": 64}\n',
                             "metadata is not text"),
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


# -- .npz archives: judged by their zip entries and .npy headers before reading ---------------

def npz_of(path: Path, members: dict[str, bytes], compress: bool = False) -> Path:
    import zipfile
    mode = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", mode) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def npy(array) -> bytes:
    import io

    import numpy as np
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.asarray(array), allow_pickle=False)
    return buffer.getvalue()


def good_members(n: int = 2) -> dict[str, bytes]:
    import numpy as np
    return {"time_ns.npy": npy(np.arange(n)), "op.npy": npy(np.array([0, 1][:n], np.int8)),
            "id.npy": npy(np.zeros(n, np.int64)), "size.npy": npy(np.full(n, 64))}


def one_error_line(capsys, path: Path) -> str:
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"allocsim: error: {path}: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err.strip()


def test_an_npz_header_claiming_a_huge_shape_is_refused_before_reading(tmp_path, capsys):
    import numpy as np
    members = good_members()
    # A .npy header claiming 10^15 int64 elements, followed by 16 bytes of data.
    head = npy(np.zeros(2, np.int64))
    members["time_ns.npy"] = head.replace(b"(2,)", b"(1000000000000000,)")
    err = one_error_line(capsys, npz_of(tmp_path / "huge-shape.npz", members))
    assert "array 'time_ns': its header claims shape (1000000000000000,)" in err


def test_an_npz_member_larger_than_the_input_limit_is_refused_by_its_zip_entry(
        tmp_path, capsys, monkeypatch):
    import numpy as np
    monkeypatch.setenv("ALLOCSIM_MAX_INPUT_BYTES", str(4 << 20))
    members = good_members()
    members["size.npy"] = npy(np.zeros(1 << 20, np.int64))  # 8 MiB, deflated to ~8 KiB
    path = npz_of(tmp_path / "big-member.npz", members, compress=True)
    assert path.stat().st_size < 1 << 20
    err = one_error_line(capsys, path)
    assert "its arrays hold more than 4,194,304 bytes, the input limit" in err


def test_a_deflated_npz_member_with_a_bomb_ratio_is_refused(tmp_path, capsys):
    import numpy as np
    members = good_members()
    members["size.npy"] = npy(np.zeros(4 << 20, np.int64))  # 32 MiB of zeros
    err = one_error_line(capsys, npz_of(tmp_path / "bomb.npz", members, compress=True))
    assert "array 'size' decompresses more than 200 times over" in err


@pytest.mark.parametrize("case", ["format-array", "pickle-member", "object-dtype",
                                  "tag-past-table", "tag-below-none"])
def test_a_malformed_npz_is_one_line(tmp_path, capsys, case):
    import pickle

    import numpy as np
    members = good_members()
    if case == "format-array":
        members["format.npy"] = npy(np.array([1, 2]))
        expected = "array 'format' should hold one string"
    elif case == "pickle-member":
        members["time_ns.npy"] = pickle.dumps([1, 2])
        expected = "array 'time_ns' is not a .npy array"
    elif case == "object-dtype":
        head = npy(np.zeros(2, np.int64)).replace(b"'<i8'", b"'|O' ")
        members["id.npy"] = head
        expected = "array 'id' holds Python objects (a pickle)"
    else:
        members["tag.npy"] = npy(np.array([0, 5 if case == "tag-past-table" else -2], np.int32))
        members["tags.npy"] = npy(np.array(json.dumps(["only"])))
        expected = (f"event 1: tag index {5 if case == 'tag-past-table' else -2} is not in "
                    "the file's 1 tags")
    err = one_error_line(capsys, npz_of(tmp_path / f"{case}.npz", members))
    assert expected in err



def test_distinct_tags_past_the_text_budget_are_refused(tmp_path, capsys):
    # 700 rows, each with its own 100 KB tag: 70 MB of call sites, which no trace has.
    rows = "".join(f"{i},alloc,{i},64,{i:06d}{'t' * 100_000}\n" for i in range(700))
    path = tmp_path / "long-tags.csv"
    path.write_text("time_ns,op,id,size,tag\n" + rows)
    err = one_error_line(capsys, path)
    assert "the distinct tags hold more than 67,108,864 characters" in err


@pytest.mark.parametrize(("key", "value"), [("dur", "NaN"), ("dur", "Infinity"),
                                            ("ts", "-Infinity")])
def test_a_profiler_op_with_a_nan_duration_is_one_line_naming_the_event(tmp_path, capsys, key,
                                                                         value):
    # Accepted silently before (issue 36, item 14): the op's tag was dropped, unsaid.
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 0.5,
          "dur": 2.0}
    path = tmp_path / "nan-dur.json"
    given = {"ts": '"ts": 0.5', "dur": '"dur": 2.0'}[key]
    path.write_text(chrome(op, memory_event()).replace(given, f'"{key}": {value}'))
    err = one_error_line(capsys, path)
    assert f"event 0: op 'aten::empty': {key} " in err and "not a finite number" in err, err


DEEP_JSON = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("command", ["check", "device-profile", "report", "sweep-toml"])
def test_deep_nesting_in_every_json_and_toml_input_is_one_line(tmp_path, capsys, command):
    trace = tmp_path / "t.csv"
    trace.write_text("time_ns,op,id,size\n0,alloc,1,64\n")
    deep = tmp_path / ("deep.toml" if command == "sweep-toml" else "deep.json")
    deep.write_text("a = " + "[" * 5_000 + "]" * 5_000 + "\n" if command == "sweep-toml"
                    else DEEP_JSON)
    argv = {"check": ["check", str(deep)],
            "device-profile": ["compare", str(trace), "--device-profile", str(deep)],
            "report": ["report", str(deep), "-o", str(tmp_path / "r.html")],
            "sweep-toml": ["sweep", str(deep), "--no-progress"]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"allocsim: error: {deep}: ") and err.count("\n") == 1, err
    assert "nested too deeply" in err



def test_strict_refuses_a_cupy_free_of_another_size_and_lenient_counts_it(tmp_path, capsys):
    hooks = [{"hook": "malloc", "device_id": 0, "size": 100, "mem_size": 512, "mem_ptr": 4096,
              "pmem_id": "0x1"},
             {"hook": "free", "device_id": 0, "mem_size": 1024, "mem_ptr": 4096,
              "pmem_id": "0x1"}]
    path = tmp_path / "free-size.log"
    path.write_text("".join(json.dumps(h) + "\n" for h in hooks))
    assert main(["info", str(path), "--strict"]) == 2
    err = capsys.readouterr().err
    assert err == (f"allocsim: error: {path}: event 1: free of mem_size 1024 for a buffer "
                   "malloc'ed with mem_size 512 (1 such; without --strict the malloc's size "
                   "is kept)\n")
    assert main(["info", str(path), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["validation"]["repairs"] == {"free_size_mismatches_kept": 1}
