"""The report is safe with any input: no field runs as script, no name reads as maths, a bad
results file is one line, and a figure that fails leaves the output folder as it was."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from report_browser import chromium, dump_dom

from allocsim.sim.cli import main
from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.output import html_report, results_dir
from allocsim.sim.output.html_report import render_report
from allocsim.sim.output.report_input import load_results
from allocsim.sim.questions.compare import compare
from allocsim.traces.formats.native.csv import write_csv
from allocsim.traces.model import Trace

# Each payload sets a mark a browser would show if it ran.
PAYLOADS = (
    "<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','img')\">",
    "</script><script>document.documentElement.setAttribute('data-pwned','script')</script>",
    "\"><svg onload=\"document.documentElement.setAttribute('data-pwned','svg')\">",
    "';document.documentElement.setAttribute('data-pwned','js');'",
    "$\\frac{$ $x^$",
)


def _small_trace(name: str) -> Trace:
    events = [(0, "alloc", 1, 1 << 20), (10, "alloc", 2, 3 << 20), (20, "free", 1, 1 << 20),
              (30, "alloc", 3, 2 << 20), (40, "free", 2, 3 << 20), (50, "free", 3, 2 << 20)]
    return Trace.from_events(events, name=name, source=name)


def _hostile_document(tmp_path: Path) -> dict:
    payload = " ".join(PAYLOADS)
    comparison = compare(_small_trace("trace " + payload), ["bfc", "on-demand"], resolve_device())
    doc = comparison.to_json_dict(timeline=True)
    doc["trace"]["source"] = payload
    doc["device"]["name"] = "dev " + payload
    doc["results"][0]["policy"] = "bfc" + payload
    doc["winner"] = doc["results"][0]["policy"]
    doc["reason"] = "because " + payload
    return doc


def test_a_results_file_with_a_string_where_a_count_belongs_is_one_line(tmp_path, capsys) -> None:
    doc = _hostile_document(tmp_path)
    doc["results"][0]["ooms"] = PAYLOADS[0]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "results[0].ooms: expected a whole number" in err[0]
    assert str(path) in err[0] and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("field, value, says", [
    ("peak_reserved", "1GiB", "results[0].peak_reserved: expected a whole number"),
    ("peak_reserved", 10 ** 400, "a number of 401 digits"),
    ("alloc_time_s", "1e400", "results[0].alloc_time_s: expected a finite number, got Infinity"),
    ("completed", "yes", "results[0].completed: expected true or false"),
    ("policy", None, "missing field 'policy'"),
], ids=["size-string", "size-10^400", "time-1e400", "flag-string", "missing"])
def test_a_results_file_with_a_bad_field_is_one_line_naming_it(tmp_path, capsys, field, value,
                                                                 says) -> None:
    doc = _hostile_document(tmp_path)
    if value is None:
        del doc["results"][0][field]
    else:
        doc["results"][0][field] = "@@" if value == "1e400" else value
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc).replace('"@@"', "1e400"))   # JSON's own 1e400, not a string
    assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_missing_and_deep_and_huge_documents_are_one_line(tmp_path, capsys) -> None:
    cases = {
        "no-trace.json": json.dumps({"results": [], "winner": None}),
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "timeline.json": None,
    }
    doc = _hostile_document(tmp_path)
    doc["results"][1]["timeline"]["reserved"][0] = 10 ** 400
    cases["timeline.json"] = json.dumps(doc)
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"allocsim: error: {path}: "), (name, err)


def test_every_string_field_is_escaped_in_the_page(tmp_path) -> None:
    page = render_report([_hostile_document(tmp_path)], title="title " + PAYLOADS[0])
    for payload in PAYLOADS[:3]:            # the ones that would break out of HTML
        assert payload not in page
    assert "<img src=x" not in page and "<svg onload" not in page
    # no payload closes a script element the page opened
    assert page.count("<script") == page.count("</script>")
    # the chart's data carry the names as they are, as JSON text the page never runs
    data = re.search(r'<script type="application/json" class=tl-data>(.*?)</script>', page)
    assert data and json.loads(data.group(1))["policies"][0]["name"].endswith(PAYLOADS[-1])


@pytest.mark.skipif(chromium() is None, reason="Chromium not installed (.ci/run installs it)")
def test_a_hostile_report_runs_no_script_in_chromium(tmp_path) -> None:
    path = tmp_path / "hostile.html"
    path.write_text(render_report([_hostile_document(tmp_path)], title="t " + PAYLOADS[1]))
    dom, _errors = dump_dom(path, tmp_path)
    assert "data-report-ready" in dom, "the page's own script did not run"
    assert not re.search(r'data-pwned="', dom), "a field ran as script"


def test_names_with_dollars_are_drawn_as_text_not_maths(tmp_path, capsys) -> None:
    name = "a$x^$b $\\frac{$"
    trace_file = tmp_path / f"{name}.csv"
    with trace_file.open("wb") as out:
        write_csv(_small_trace(name), out)
    out_dir = tmp_path / "out"
    assert main(["compare", str(trace_file), "--policies", "bfc", "on-demand",
                 "-o", str(out_dir), "--figures"]) == 0, capsys.readouterr().err
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == ["fragmentation.png", "memory_timeline.png", "peaks.png", "report.html",
                     "results.json"]


def test_a_figure_that_fails_leaves_the_folder_as_it_was(tmp_path, monkeypatch) -> None:
    trace = _small_trace("t")
    comparison = compare(trace, ["bfc"], resolve_device())
    out = tmp_path / "out"
    results_dir.write_comparisons([comparison], out, figures=True)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken(*_args, **_kwargs):
        raise ValueError("the figure failed")
    monkeypatch.setattr(html_report, "fragmentation_fig", broken)
    with pytest.raises(ValueError):
        results_dir.write_comparisons([compare(trace, ["on-demand"], resolve_device())], out,
                                      figures=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    fresh = tmp_path / "fresh"
    with pytest.raises(ValueError):
        results_dir.write_comparisons([comparison], fresh, figures=True)
    assert not fresh.exists() or not any(fresh.iterdir())


def test_load_results_reads_what_compare_writes(tmp_path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_hostile_document(tmp_path)))
    assert load_results([path])[0]["results"][1]["policy"] == "on-demand"


def test_tags_and_stack_frames_are_escaped_in_who_holds_memory() -> None:
    from allocsim.sim.output.holders import Holding, holders_section
    hostile = Holding(PAYLOADS[0], 1 << 20, 1, [0], frames=[PAYLOADS[1], PAYLOADS[2]])
    page = holders_section([hostile, Holding("layer3/" + PAYLOADS[2], 1 << 10, 1, [1])], 1 << 21)
    for payload in PAYLOADS[:3]:
        assert payload not in page
    assert "&lt;img src=x" in page and "&lt;/script&gt;" in page
