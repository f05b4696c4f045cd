"""The report says what the CLI says, and its figures read at a glance (issue 37): one size
unit per trace's figures, equal widths with time axes that line up, near colours told apart
by dashes, titles that fit, the peak explained, a suggested command that runs, PNGs only on
request, and progress on the slow steps of ``compare``."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from allocsim.policies import DEFAULT_POLICIES
from allocsim.sim.cli import common
from allocsim.sim.cli.main import main
from allocsim.sim.kernel.device import resolve_device
from allocsim.sim.output import figures
from allocsim.sim.output.colours import near_colours, policy_colours, policy_dashes
from allocsim.sim.output.html_report import render_report
from allocsim.sim.output.interactive import timeline_payload
from allocsim.sim.questions.compare import compare
from allocsim.traces.bundled import bundled_path, load_default_trace
from allocsim.traces.formats import load

HTA = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / \
    "torch-profiler-cuda-hta.json.gz"


@pytest.fixture(scope="module")
def jax_doc() -> dict:
    """A run whose preallocated pool (60 GiB) is far past its 25 MiB live: the case that put
    the timeline in MiB and the bars in GiB."""
    trace = load(bundled_path("sample-jax-cpu-train.npz"))
    comparison = compare(trace, list(DEFAULT_POLICIES), resolve_device())
    return comparison.to_json_dict(timeline=True)


def _unit(label: str) -> str:
    return label.split("(")[-1].rstrip(")").strip()


def test_every_figure_of_a_trace_has_one_size_unit(jax_doc: dict) -> None:
    results = jax_doc["results"]
    timeline = figures.timeline_fig(results, "t")
    peaks = figures.peaks_fig(results, "t")
    units = {timeline.axes[0].get_ylabel(), peaks.axes[0].get_xlabel(),
             timeline_payload(jax_doc, "x")["y_unit"]}
    assert units == {"MiB"}, units
    page = render_report([jax_doc])
    assert "peak reserved per policy, in MiB" in page
    assert "60.00GiB ▶ off the scale" in page             # the pool is named, not the scale
    figures.pyplot().close("all")


def test_figures_are_equally_wide_and_their_time_axes_line_up(jax_doc: dict) -> None:
    results = jax_doc["results"]
    drawn = [figures.timeline_fig(results, "memory over time"), figures.peaks_fig(results),
             figures.fragmentation_fig(results, "t")]
    assert len({round(fig.get_size_inches()[0], 3) for fig in drawn}) == 1
    timeline, _, fragmentation = drawn
    spans = {(round(ax.get_position().x0, 4), round(ax.get_position().x1, 4))
             for ax in [*timeline.axes, *fragmentation.axes]}
    assert len(spans) == 1, spans
    figures.pyplot().close("all")


def test_the_fragmentation_title_fits_inside_its_figure(jax_doc: dict) -> None:
    fig = figures.fragmentation_fig(jax_doc["results"],
                                    "torch-profiler-cuda-hta on h100-80g@24.00GiB")
    fig.canvas.draw()
    title = fig.get_suptitle() and fig._suptitle.get_window_extent()
    assert title and title.x1 <= fig.bbox.width and title.y1 <= fig.bbox.height
    figures.pyplot().close("all")


def test_policies_whose_colours_look_alike_have_different_dashes() -> None:
    policies = list(DEFAULT_POLICIES)
    colours, dashes = policy_colours(policies), policy_dashes(policies)
    for a, b in itertools.combinations(policies, 2):
        if near_colours(colours[a], colours[b]):
            assert dashes[a] != dashes[b], (a, b)
    # the three blues of the default set: pytorch, best-fit, on-demand
    assert near_colours(colours["pytorch"], colours["best-fit"])
    assert near_colours(colours["pytorch"], colours["on-demand"])


def test_the_timeline_and_the_chart_draw_each_policy_with_its_dash(jax_doc: dict) -> None:
    dashes = policy_dashes([r["policy"] for r in jax_doc["results"]])
    payload = timeline_payload(jax_doc, "x")
    assert {p["name"]: tuple(p["dash"]) for p in payload["policies"]} == dashes
    fig = figures.timeline_fig(jax_doc["results"], "t")
    overview = fig.axes[0]
    styles = {line.get_color().upper(): line.get_linestyle() for line in overview.get_lines()}
    colours = policy_colours(list(dashes))
    assert styles[colours["pytorch"].upper()] == "--" and styles[colours["bfc"].upper()] == "-"
    figures.pyplot().close("all")


def test_compare_out_writes_pngs_only_when_asked(tmp_path: Path, capsys) -> None:
    plain, drawn = tmp_path / "plain", tmp_path / "drawn"
    assert main(["compare", "default", "--policies", "bfc", "pytorch", "-o", str(plain)]) == 0
    assert sorted(p.name for p in plain.iterdir()) == ["report.html", "results.json"]
    page = (plain / "report.html").read_text()
    assert "<img" not in page and "class=tl " in page and "<div class=pbars>" in page
    assert main(["compare", "default", "--policies", "bfc", "pytorch", "-o", str(drawn),
                 "--figures"]) == 0
    assert {"memory_timeline.png", "peaks.png", "fragmentation.png"} <= {
        p.name for p in drawn.iterdir()}
    assert (drawn / "report.html").read_text().count("data:image/png;base64,") == 3


def test_the_page_says_the_context_and_explains_the_peak(tmp_path: Path) -> None:
    trace = load_default_trace()
    comparison = compare(trace, ["bfc", "pytorch", "best-fit"], resolve_device())
    from allocsim.sim.output.results_dir import write_comparisons
    write_comparisons([comparison], tmp_path, traces=[trace])
    page = (tmp_path / "report.html").read_text()
    assert "<b>512.00MiB</b> is assumed held by the CUDA context" in page
    assert "Not modelled:" in page
    explain = page[page.index(">Explain the peak<"):]
    assert "<b>best-fit</b> reserves <b>1.59GiB</b>" in explain
    assert "<code>optimizer/state</code> 768.66MiB (49%) → 1.16GiB" in explain


def test_memory_live_before_recording_and_the_recorded_reserved_are_explained() -> None:
    trace = load_default_trace()
    doc = compare(trace, ["pytorch"], resolve_device()).to_json_dict()
    doc["trace"]["live_before_recording"] = {"min": 3 << 30, "max": 3 << 30,
                                             "in_replay": False}
    from allocsim.sim.output.html_report import TraceDetails
    from allocsim.sim.output.report_context import RecordingFacts
    pytorch = doc["results"][0]["peak_reserved"]
    details = TraceDetails([], 0, None, RecordingFacts(pytorch + (4 << 30), ["a thing"]))
    page = render_report([doc], details=[details])
    assert "<b>3.00GiB</b> was live before the recording started" in page
    assert "not</b> in the replay" in page and "--start-state unrecorded" in page
    assert "4.00GiB less: 3.00GiB of it is memory live before the recording" in page
    assert "1.00GiB is what the allocator kept cached beyond the model" in page
    assert "Not modelled: a thing; memory outside the recorded allocator" in page


@pytest.mark.skipif(not HTA.exists(), reason="the HTA recording is not at hand")
def test_the_hta_report_shows_what_its_recording_held(tmp_path: Path) -> None:
    assert main(["compare", str(HTA), "--policies", "pytorch", "-o", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "<b>3.82GiB</b> was live before the recording started" in page
    assert "reserved up to <b>11.90GiB</b>" in page
    assert f"allocsim export-snapshot {HTA}" in page or "export-snapshot ~/" in page


def test_the_suggested_export_command_keeps_the_traces_folder(tmp_path: Path, capsys,
                                                              monkeypatch) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "job.csv").write_text("time_ns,op,id,size\n0,alloc,1,1048576\n10,free,1,\n")
    monkeypatch.chdir(tmp_path)
    assert main(["compare", "runs/job.csv", "--policies", "bfc", "-o", "out"]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "allocsim export-snapshot runs/job.csv --policy bfc" in page


def test_compare_says_what_it_is_doing_on_a_log(tmp_path: Path, capsys, monkeypatch) -> None:
    """Stderr is not a terminal under pytest: plain lines, one per step when the interval
    is 0 (the steps are counted, not timed)."""
    monkeypatch.setattr(common, "PROGRESS_INTERVAL_S", 0.0)
    assert main(["compare", "default", "--policies", "bfc", "pytorch", "-o",
                 str(tmp_path / "o"), "--figures", "--json"]) == 0
    out, err = capsys.readouterr()
    json.loads(out)                                     # stdout stays one JSON document
    lines = err.splitlines()
    assert any(line.startswith("allocsim: compare: reading default") for line in lines)
    for policy in ("bfc", "pytorch"):
        assert any(f"replaying default-training: {policy} (policy" in line for line in lines)
    assert any("drawing memory_timeline.png" in line for line in lines)
    assert any("writing the report" in line for line in lines)
    assert lines[-2].startswith("allocsim: compare: done in ")
    assert lines[-1].startswith("wrote ")               # every -o says what it wrote, last
    assert "\r" not in err


def test_a_quick_compare_stays_silent_at_the_default_interval(capsys) -> None:
    assert common.PROGRESS_INTERVAL_S <= 3          # "every few seconds", past two seconds
    assert main(["compare", "default", "--policies", "bfc"]) == 0
    assert capsys.readouterr().err == ""


def test_tune_png_keeps_its_points_in_view_when_the_card_is_far_past_them(
        tmp_path: Path, monkeypatch) -> None:
    from allocsim.sim.output import tune_output
    drawn = []
    monkeypatch.setattr(tune_output, "save", lambda fig, path: drawn.append(fig) or Path(path))
    assert main(["tune", "default", "--framework", "pytorch", "--capacity", "80GiB",
                 "-o", str(tmp_path)]) == 0
    ax = drawn[0].axes[0]
    assert ax.get_xlim()[1] < 80 * 1024 / 4                # MiB: nowhere near the card
    assert any("card 80.00GiB (off the scale)" in t.get_text()
               for t in ax.get_legend().get_texts())
    figures.pyplot().close("all")


def test_info_says_it_is_reading_on_a_log(capsys, monkeypatch) -> None:
    monkeypatch.setattr(common, "PROGRESS_INTERVAL_S", 0.0)
    assert main(["info", "default"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "allocsim: info: reading default, 0 s"
    assert any(line.startswith("allocsim: info: summarizing ") for line in lines)


def test_on_a_terminal_progress_is_one_line_rewritten_and_cleared() -> None:
    import io
    clock = iter([0.0, 0.05, 0.2, 0.3]).__next__
    stream = io.StringIO()
    with common.TerminalProgress("compare", stream=stream, clock=clock) as progress:
        progress.update("reading a")
        progress.update("reading b")          # 50 ms later: not redrawn
        progress.update("replaying a")
    assert stream.getvalue() == ("\r\x1b[K  compare: reading a\r\x1b[K  compare: replaying a"
                                 "\r\x1b[K")
