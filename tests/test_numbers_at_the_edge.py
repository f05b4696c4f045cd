"""Numbers a user types or a file holds are read once, at the edge: ASCII digits only, and
within what the model holds (64-bit sizes, a device of at most 1 EiB). Past that they are one
`allocsim: error:` line naming the option and the limit, exit 2 — never a traceback from
``int()`` or a ``std::bad_cast`` from the native core (issue 36, items 9 and 10)."""

from __future__ import annotations

from pathlib import Path

import pytest
from one_line import refused

from allocsim.ascii_numbers import is_whole_number, whole_number
from allocsim.policies import PolicySpecError, parse_policy
from allocsim.policies.pytorch.caching import parse_alloc_conf
from allocsim.sim.cli.main import main
from allocsim.sim.kernel.device import SimulatedDevice, resolve_device
from allocsim.traces import formats, synth

XLA_DUMP = Path(__file__).parent / "data" / "xla" / "cpu"


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.npz"
    formats.save(synth.generate("training", seed=1, events=300), path)
    return path


# -- one reading of a whole number ----------------------------------------------------------

@pytest.mark.parametrize("text", ["²", "١٢٨", "", "+1", " 1", "1_000", "1.0", "1" * 41])
def test_only_ascii_digits_are_a_whole_number(text: str) -> None:
    assert not is_whole_number(text)
    with pytest.raises(ValueError) as err:
        whole_number(text)
    assert "\n" not in str(err.value) and len(str(err.value)) < 120


def test_a_whole_number_reads_as_int_does_for_ascii() -> None:
    assert whole_number("128") == 128 and whole_number("-3", signed=True) == -3
    assert is_whole_number("0007")


# -- 9. numbers past 64 bits are refused where they are typed --------------------------------

@pytest.mark.parametrize("value", ["16EiB", "18446744073709551616", "2EiB"])
@pytest.mark.parametrize("command", [["compare"], ["tune", "--framework", "pytorch"],
                                     ["validate", "--policy", "bfc"]])
def test_a_capacity_past_the_largest_device_is_one_line_naming_the_limit(capsys, trace, value,
                                                                       command):
    name, *rest = command
    line = refused(capsys, name, trace, *rest, "--capacity", value)
    assert line.startswith("allocsim: error: --capacity: at most 1.00EiB"), line


def test_the_api_refuses_that_capacity_too() -> None:
    with pytest.raises(ValueError, match=r"at most 1\.00EiB"):
        resolve_device("a100-80g", "16EiB")


def test_a_sweep_capacity_past_the_largest_device_is_refused_before_any_cell(capsys,
                                                                            tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('output = "out.jsonl"\n[grid]\ntraces = ["synth:random?events=300"]\n'
                    'policies = ["bfc"]\ncapacities = ["16GiB", "18446744073709551616"]\n')
    line = refused(capsys, "sweep", path, "--no-progress", "--workers", "1")
    assert "grid.capacities" in line and "at most 1.00EiB" in line, line
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(("conf", "needle"), [
    ("max_split_size_mb:99999999999999999999999", "max_split_size_mb too large, must be at most"),
    ("max_non_split_rounding_mb:9223372036854775807", "max_non_split_rounding_mb too large"),
    ("roundup_power2_divisions:9223372036854775808", "roundup_power2_divisions: at most 2**53"),
    ("roundup_power2_divisions:[256:9223372036854775808]", "at most 2**53"),
])
def test_alloc_conf_values_past_the_model_are_one_line(capsys, trace, conf, needle):
    line = refused(capsys, "compare", trace, "--alloc-conf", conf)
    assert needle in line, line


def test_the_registry_refuses_them_before_the_native_core_sees_them() -> None:
    device = SimulatedDevice(resolve_device("a100-80g")).view(0)
    with pytest.raises(PolicySpecError, match="too large"):
        parse_policy("pytorch:max_split_size_mb=99999999999999999999999").build(device)
    with pytest.raises(PolicySpecError, match="at most 2"):
        parse_policy("pytorch:roundup_power2_divisions=9223372036854775808").build(device)


# -- 10. Unicode digits are not numbers ------------------------------------------------------

@pytest.mark.parametrize("conf", ["max_split_size_mb:١٢٨", "max_split_size_mb:²",
                                  "roundup_power2_divisions:٤", "pinned_num_register_threads:٨",
                                  "garbage_collection_threshold:٠.٥"])
def test_alloc_conf_takes_ascii_digits_as_pytorchs_parser_does(conf: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_alloc_conf(conf)
    assert conf.split(":")[0] in str(err.value) and "ASCII" in str(err.value)


def test_a_policy_spec_takes_ascii_digits() -> None:
    with pytest.raises(PolicySpecError, match="ASCII"):
        parse_policy("pytorch:max_split_size_mb=١٢٨")
    with pytest.raises(PolicySpecError, match="ASCII"):
        parse_policy("bfc:fraction=٠.٥")


@pytest.mark.parametrize("option", ["--steps", "--module"])
def test_an_xla_dump_option_in_unicode_digits_is_one_line(capsys, option):
    line = refused(capsys, "info", XLA_DUMP, option, "²")
    assert "'²'" in line, line


def test_a_device_index_in_unicode_digits_is_one_line(capsys, trace):
    refused(capsys, "info", trace, "--device-index", "²")


def test_a_parameter_number_in_unicode_digits_is_not_a_parameter(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    dump.mkdir()
    for source in XLA_DUMP.iterdir():
        text = source.read_text()
        if source.name.endswith("-buffer-assignment.txt"):
            text = text.replace("parameter 0", "parameter ²")
        (dump / source.name).write_text(text)
    formats.load(dump, module="jit_train_step")     # no ValueError from int("²")


@pytest.mark.parametrize("value", ["²", "١٠٠٠٠٠٠", "0", "lots"])
def test_the_input_limit_in_the_environment_is_ascii_digits_or_one_line(capsys, monkeypatch,
                                                                        trace, value):
    monkeypatch.setenv("ALLOCSIM_MAX_INPUT_BYTES", value)
    line = refused(capsys, "info", trace)
    assert "ALLOCSIM_MAX_INPUT_BYTES" in line, line


def test_a_range_in_unicode_digits_is_not_a_range(tmp_path: Path) -> None:
    from allocsim.sim.sweeps.grid import expand_ranges
    assert expand_ranges("x[1..3]") == ["x1", "x2", "x3"]
    assert expand_ranges("x[١..٣]") == ["x١..٣"]


def test_a_cupy_log_pointer_in_unicode_digits_is_no_integer(capsys, tmp_path: Path) -> None:
    path = tmp_path / "hooks.log"
    path.write_text('{"hook": "malloc", "device_id": 0, "size": 512, "mem_size": 512, '
                    '"mem_ptr": "0x١٠٠٠", "pmem_id": "0x1"}\n')
    line = refused(capsys, "info", path)
    assert "mem_ptr '0x١٠٠٠' is not an integer" in line, line


@pytest.mark.parametrize("param", ["events=١٠٠", "dropout=٠.١"])
def test_a_generator_parameter_in_unicode_digits_is_one_line(capsys, tmp_path: Path, param):
    line = refused(capsys, "gen", "training", param, "-o", tmp_path / "g.csv")
    assert "ASCII" in line and param.split("=")[1] in line, line
    assert not (tmp_path / "g.csv").exists()


@pytest.mark.parametrize(("argv", "needle"), [
    (["info", "{trace}", "--top", "٣"], "argument --top: invalid int value: '٣'"),
    (["info", "{trace}", "--top", "²"], "argument --top: invalid int value: '²'"),
    (["compare", "{trace}", "--max-slowdown", "١.٥"], "argument --max-slowdown: invalid float"),
    (["sweep", "x.toml", "--workers", "٢"], "argument --workers: invalid int value"),
])
def test_a_numeric_option_in_unicode_digits_is_argparses_one_line(capsys, trace, argv, needle):
    try:
        code = main([a.format(trace=trace) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and needle in err and err.count("\n") == 1, err
