"""The HTML report: the answer first, every figure embedded, details linkable, who holds memory
grouped, the interactive timeline's data exact at the peaks, and a hook for other sections."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import pytest

from allocsim import __version__
from allocsim.sim.cli import main
from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.output.figure_data import FRAGMENTATION_NAME, size_unit
from allocsim.sim.output.holders import group_by_kind, live_at_peak, natural_key, split_layer
from allocsim.sim.output.html_report import (
    MEMORY_VIZ_URL,
    ReportSection,
    render_report,
    suggested_trace_argument,
)
from allocsim.sim.output.interactive import timeline_payload
from allocsim.sim.output.ownership import REPORT_MARK
from allocsim.sim.output.report_input import load_results
from allocsim.sim.output.results_dir import write_comparisons
from allocsim.sim.questions.compare import compare
from allocsim.traces.bundled import bundled_path, load_default_trace


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    assert main(["compare", str(bundled_path()), "--policies", "bfc", "best-fit", "offline",
                 "--out", str(out), "--figures"]) == 0
    assert main(["min-capacity", "default", "--policies", "bfc", "on-demand",
                 "--out", str(out)]) == 0
    return out


def test_compare_out_writes_a_self_contained_page(results_dir: Path) -> None:
    page = (results_dir / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 3
    # nothing fetched from a network: the one web address is a link for the reader to follow
    addresses = re.findall(r"https?://[^\s\"<]+", page)
    assert set(addresses) == {MEMORY_VIZ_URL}
    assert not re.search(r'(src|href)="(?!data:|#|https://pytorch\.org/memory_viz")', page)
    assert "winner: best-fit" in page and "offline" in page
    assert "uPlot" in page and "class=tl " in page       # the chart library is in the page


def test_the_summary_comes_first_with_one_line_per_policy_and_links_to_details(
        results_dir: Path) -> None:
    page = render_report(load_results([results_dir / "results.json",
                                       results_dir / "min_capacity.json"]))
    summary = page.index("<section id=summary>")
    assert summary < page.index("class=tl ")
    block = page[summary:page.index("</section>", summary)]
    head = re.search(r"<table class=summary><tr>(.*?)</tr>", block)
    assert head and re.findall(r"<th>(.*?)</th>", head.group(1)) == [
        "policy", "completes", "peak reserved", "minimum card", "modelled slowdown"]
    rows = re.findall(r"<tr(?: class=winner)?><td>([^<]+)</td>", block)
    assert rows == ["bfc", "best-fit", "offline"]
    assert "<tr class=winner><td>best-fit</td>" in block and "winner: best-fit</b> — " in block
    # minimum card from min_capacity.json of the same trace; offline was not sized
    capacity = json.loads((results_dir / "min_capacity.json").read_text())
    bfc_card = next(a for a in capacity["answers"] if a["policy"] == "bfc")["min_capacity"]
    from allocsim.policies.units import format_size
    assert f"<td>{format_size(bfc_card)}</td>" in block
    # each trace's name links to its details, which carry that anchor
    link = re.search(r'<a href="#(trace-1-[a-z0-9-]+)">', block)
    assert link and f"<h2 id={link.group(1)}>" in page


def test_a_tuner_can_fill_the_setting_to_paste_and_add_a_section(results_dir: Path) -> None:
    docs = load_results([results_dir / "results.json"])
    name = docs[0]["trace"]["name"]
    page = render_report(docs, settings={name: "PYTORCH_CUDA_ALLOC_CONF=<x>"},
                         sections=[ReportSection("tune", "Tuning", "<p>tuned</p>")])
    assert "setting to paste: <code>PYTORCH_CUDA_ALLOC_CONF=&lt;x&gt;</code>" in page
    assert "<h2 id=tune>Tuning" in page and '<a href="#tune">Tuning</a>' in page
    assert page.index("<h2 id=tune>") > page.index("<section id=summary>")
    assert "setting to paste" not in render_report(docs)


def test_every_figure_has_a_real_description(results_dir: Path) -> None:
    page = (results_dir / "report.html").read_text()
    alts = [html.unescape(a) for a in re.findall(r'<img alt="([^"]*)" src=', page)]
    assert len(alts) == 3 and 'alt="figure"' not in page
    assert alts[0].startswith("memory over time — ") and "bfc peaks at " in alts[0]
    assert alts[1].startswith("peak reserved — ") and "linear scale" in alts[1]
    assert alts[2].startswith("free share of reserved memory — ") and "best-fit " in alts[2]
    assert all(len(a) > 80 for a in alts)


def test_frag_is_the_clis_number_under_the_clis_name_and_free_at_peak_is_defined_apart(
        results_dir: Path, capsys) -> None:
    """The CLI's "frag" (1 − util) and the panels' "free at peak" gave 19.3% and 23.8% for
    one run under two names with no word on why: the table now shows the CLI's number under
    the CLI's name, and the page defines both where it shows them."""
    page = (results_dir / "report.html").read_text()
    doc = json.loads((results_dir / "results.json").read_text())
    bfc = next(r for r in doc["results"] if r["policy"] == "bfc")
    assert main(["compare", str(bundled_path()), "--policies", "bfc"]) == 0
    cli_row = next(line for line in capsys.readouterr().out.splitlines()
                   if line.startswith("bfc "))
    frag = f"{1 - bfc['peak_allocated'] / bfc['peak_reserved']:.1%}"
    assert frag in cli_row.split()
    details = page[page.index("<h2 id=trace-1-"):]
    row = re.search(r"<tr><td>bfc</td>(.*?)</tr>", details)
    assert row and f"<td>{frag}</td>" in row.group(1)
    assert "<th>frag</th>" in page and f"<th>{FRAGMENTATION_NAME}</th>" not in page
    legends = " ".join(re.findall(r"<p class=legend>(.*?)</p>", page))
    assert "<b>frag</b>: 1 − util" in legends and f"<b>{FRAGMENTATION_NAME}</b>" in legends
    share = f"{bfc['external_fragmentation'] / bfc['peak_reserved']:.1%}"
    alts = [html.unescape(a) for a in re.findall(r'<img alt="([^"]*)" src=', page)]
    assert f"bfc {share}" in alts[2]                    # the panels keep free at peak


def test_the_page_names_the_version_explains_the_columns_and_points_to_memory_viz(
        results_dir: Path) -> None:
    page = (results_dir / "report.html").read_text()
    assert f"{REPORT_MARK} {__version__}," in page          # still recognised as a report
    legend = re.search(r"<p class=legend>(.*?)</p>", page)
    assert legend
    for column in ("peak reserved", "peak allocated", "util", "frag", "dev mallocs",
                   "dev frees", "alloc time", "slowdown"):
        assert f"<b>{column}" in legend.group(1) or f"/ {column}</b>" in legend.group(1), column
    assert "allocsim export-snapshot " in page and "--policy bfc -o run.pickle" in page
    assert f'<a href="{MEMORY_VIZ_URL}">' in page


def test_suggested_commands_keep_the_folder_but_never_the_users_home() -> None:
    """A bare file name did not run from where compare ran; a home folder's user name is
    not the reader's business (issue 37)."""
    home = Path.home()
    assert suggested_trace_argument({"name": "run", "source": str(home / "jobs" / "run.csv")}) \
        == "~/jobs/run.csv"
    assert suggested_trace_argument({"name": "hta", "source": "../shared/traces/h.json.gz"}) \
        == "../shared/traces/h.json.gz"
    assert suggested_trace_argument({"name": "x", "source": "/data/runs/x.npz"}) \
        == "/data/runs/x.npz"
    assert suggested_trace_argument({"name": "default-training", "source": "/x/y.npz"}) \
        == "default"
    assert suggested_trace_argument({"name": "t", "source": "synth:training"}) == "TRACE"


def test_who_holds_memory_is_grouped_by_kind_and_layer_in_natural_order(tmp_path: Path) -> None:
    trace = load_default_trace()
    holdings = live_at_peak(trace)
    assert sum(h.bytes for h in holdings) == trace.peak_live()[0]
    groups = group_by_kind(holdings)
    assert [g.bytes for g in groups] == sorted((g.bytes for g in groups), reverse=True)
    # the top rows explain the peak: a few kinds hold most of it
    assert sum(g.bytes for g in groups[:3]) >= 0.9 * trace.peak_live()[0]
    state = next(g for g in groups if g.kind == "optimizer/state")
    layers = [label for label, _ in state.members]
    assert layers[:3] == ["layer0", "layer1", "layer2"] and layers[-1] == "layer11"
    comparison = compare(trace, ["bfc", "on-demand"], resolve_device())
    write_comparisons([comparison], tmp_path, traces=[trace])
    page = (tmp_path / "report.html").read_text()
    assert "Who holds memory at the peak" in page
    assert "<span class=kname>optimizer/state</span>" in page
    assert page.count("<details class=kind>") == len(groups)
    write_comparisons([comparison], tmp_path)                    # no trace: no such view
    assert "Who holds memory" not in (tmp_path / "report.html").read_text()


def test_layers_and_kinds_are_read_from_tags() -> None:
    assert split_layer("backward/layer1/grad") == ("backward/grad", "layer1")
    assert split_layer("model.layers.10.mlp") == ("model.mlp", "layers.10")
    assert split_layer("transformer.h.3.attn") == ("transformer.attn", "h.3")
    assert split_layer("aten::empty_strided") == ("aten::empty_strided", None)
    assert split_layer("sha1/hash") == ("sha1/hash", None)
    assert sorted(["layer10", "layer2", "layer1"], key=natural_key) == [
        "layer1", "layer2", "layer10"]


def test_the_timeline_data_share_one_axis_and_keep_every_peak(results_dir: Path) -> None:
    doc = json.loads((results_dir / "results.json").read_text())
    payload = timeline_payload(doc, "t")
    assert payload is not None
    for policy, result in zip(payload["policies"], doc["results"]):
        assert max(v for v in policy["reserved"] if v is not None) == result["peak_reserved"]
    assert max(payload["live"]) == doc["trace"]["peak_live"]
    assert payload["x"] == sorted(payload["x"]) and payload["x_label"].startswith("trace time")
    assert len(payload["x"]) <= 2048


def test_a_run_stopped_by_an_oom_is_put_onto_the_same_buckets_keeping_its_peak() -> None:
    trace = load_default_trace()
    device = resolve_device(capacity=int(trace.peak_live()[0] * 1.02) >> 21 << 21)
    comparison = compare(trace, ["bfc", "on-demand"], device)
    doc = comparison.to_json_dict(timeline=True)
    assert not doc["results"][0]["completed"] and doc["results"][1]["completed"]
    payload = timeline_payload(doc, "t")
    assert payload is not None
    for policy, result in zip(payload["policies"], doc["results"]):
        values = [v for v in policy["reserved"] if v is not None]
        assert max(values) == max(result["timeline"]["reserved"])
        assert len(policy["reserved"]) == len(payload["x"])


def test_one_colour_per_policy_and_units_from_the_data() -> None:
    assert size_unit(25 << 20) == ("MiB", 1 << 20) and size_unit(60 << 30)[0] == "GiB"
    assert size_unit(512)[0] == "B" and size_unit(3 << 10)[0] == "KiB"


def test_report_combines_comparisons_and_capacity_answers(results_dir: Path, capsys) -> None:
    out = results_dir / "all.html"
    assert main(["report", str(results_dir / "results.json"),
                 str(results_dir / "min_capacity.json"), "-o", str(out), "--title", "nightly"]) == 0
    page = out.read_text()
    assert "<title>nightly</title>" in page and "minimum capacity" in page
    assert page.count("data:image/png;base64,") == 0      # the browser's charts by default
    assert main(["report", str(results_dir / "results.json"),
                 str(results_dir / "min_capacity.json"), "-o", str(out), "--figures"]) == 0
    assert out.read_text().count("data:image/png;base64,") == 4


def test_compare_out_with_several_traces_writes_one_array_and_one_page(tmp_path: Path) -> None:
    # all bundled traces
    assert main(["compare", "--policies", "bfc", "--out", str(tmp_path), "--figures"]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    from allocsim.traces.bundled import bundled_names
    traces = len(bundled_names())
    assert isinstance(data, list) and len(data) == traces
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 * traces
    assert page.count("class=tl ") == traces and page.count("uPlot=function") == 1
    assert (tmp_path / "01-sample-jax-cpu-train-peaks.png").exists()


def test_a_file_that_is_not_results_is_one_clear_error(tmp_path: Path, capsys) -> None:
    bogus = tmp_path / "x.json"
    bogus.write_text(json.dumps({"hello": 1}))
    assert main(["report", str(bogus)]) == 2
    assert "not an allocsim results file" in capsys.readouterr().err


def test_the_static_figures_share_one_time_axis_and_one_size_scale(results_dir: Path) -> None:
    from allocsim.sim.output.figures import timeline_fig
    doc = json.loads((results_dir / "results.json").read_text())
    fig = timeline_fig(doc["results"])
    axes = fig.get_axes()
    assert len(axes) == 1 + len(doc["results"])
    assert len({ax.get_xlim() for ax in axes}) == 1 and len({ax.get_ylim() for ax in axes}) == 1
    fig.canvas.draw()
    labels = [t.get_text() for ax in axes for t in ax.get_yticklabels() + ax.get_xticklabels()]
    assert labels and not any("×10" in t or "e+" in t or "1e" in t for t in labels)
    assert not any(ax.yaxis.get_offset_text().get_text() for ax in axes)
    end = max(r["timeline"]["trace_time_ns"][-1] for r in doc["results"]) / 1e6   # ms
    assert np.isclose(axes[0].get_xlim()[1], end)


def test_a_comparison_without_timelines_still_makes_a_page(results_dir: Path) -> None:
    doc = json.loads((results_dir / "results.json").read_text())
    for result in doc["results"]:
        del result["timeline"]              # as `compare --json` prints it
    page = render_report(load_results_from(doc, results_dir))
    assert "class=tl " not in page and "<div class=pbars>" in page   # bars need no timeline
    assert "<section id=summary>" in page
    page = render_report(load_results_from(doc, results_dir), figures=True)
    assert "class=tl " not in page and page.count("<img") == 3


def load_results_from(doc: dict, folder: Path) -> list[dict]:
    path = folder / "no-timelines.json"
    path.write_text(json.dumps(doc))
    return load_results([path])
