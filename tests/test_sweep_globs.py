"""A sweep's trace globs list each trace file once and never follow a folder twice (issue
36.6): a ``latest -> .`` link counted one trace 41 times, and two links back up the tree kept
the expansion running. Work is counted (folders listed), not timed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from allocsim.sim.sweeps.grid import load_definition
from allocsim.traces import formats, synth


def write_sweep(folder: Path, traces: str) -> Path:
    path = folder / "t.toml"
    path.write_text(f'name = "t"\noutput = "out/results.jsonl"\n[grid]\ntraces = [{traces}]\n'
                    'policies = ["bfc"]\n')
    return path


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    folder = tmp_path / "traces"
    (folder / "runs").mkdir(parents=True)
    trace = synth.generate("random", seed=1, events=200)
    formats.save(trace, folder / "a.npz")
    formats.save(trace, folder / "runs" / "b.npz")
    return folder


def count_listings(monkeypatch: pytest.MonkeyPatch, limit: int) -> list[int]:
    """Count the folders listed (os.scandir, which glob and os.walk use), failing past
    ``limit``."""
    listed = [0]
    scandir = os.scandir

    def counted(*args, **kwargs):
        listed[0] += 1
        if listed[0] > limit:
            raise AssertionError(f"more than {limit} folders listed")
        return scandir(*args, **kwargs)
    monkeypatch.setattr(os, "scandir", counted)
    return listed


def test_a_link_to_its_own_folder_counts_each_trace_once(tmp_path, traces, monkeypatch):
    (traces / "latest").symlink_to(".")
    listed = count_listings(monkeypatch, limit=20)
    sweep = load_definition(write_sweep(tmp_path, '"traces/**/*.npz"'))
    assert [t.key for t in sweep.traces] == ["traces/a.npz", "traces/runs/b.npz"]
    assert listed[0] <= 4       # traces, traces/runs: each folder once (and no more)


def test_two_links_back_up_the_tree_end_the_walk(tmp_path, traces, monkeypatch):
    """Each level holds two ways back: 2^40 paths for glob, two folders here."""
    (traces / "runs" / "up").symlink_to("..")
    (traces / "runs" / "top").symlink_to("..")
    (traces / "again").symlink_to(".")
    count_listings(monkeypatch, limit=20)
    sweep = load_definition(write_sweep(tmp_path, '"traces/**/*.npz"'))
    assert [t.key for t in sweep.traces] == ["traces/a.npz", "traces/runs/b.npz"]


def test_a_file_under_two_names_is_one_trace(tmp_path, traces):
    """A link to a trace, a linked folder, or the same file by two entries: one cell row."""
    (traces / "alias.npz").symlink_to("a.npz")
    (traces / "current").symlink_to("runs")
    sweep = load_definition(write_sweep(
        tmp_path, '"traces/*.npz", "traces/**/*.npz", "traces/current/b.npz"'))
    assert [t.key for t in sweep.traces] == ["traces/a.npz", "traces/runs/b.npz"]


def test_a_folder_reached_only_through_a_link_is_still_searched(tmp_path, traces):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    formats.save(synth.generate("random", seed=2, events=200), elsewhere / "c.npz")
    (traces / "more").symlink_to(elsewhere)
    sweep = load_definition(write_sweep(tmp_path, '"traces/**/*.npz"'))
    assert [t.key for t in sweep.traces] == [
        "traces/a.npz", "traces/more/c.npz", "traces/runs/b.npz"]


def test_hidden_names_stay_hidden_as_in_glob(tmp_path, traces):
    (traces / ".cache").mkdir()
    formats.save(synth.generate("random", seed=3, events=200), traces / ".cache" / "d.npz")
    formats.save(synth.generate("random", seed=3, events=200), traces / ".e.npz")
    sweep = load_definition(write_sweep(tmp_path, '"traces/**/*.npz", "traces/.*.npz"'))
    assert [t.key for t in sweep.traces] == [
        "traces/a.npz", "traces/runs/b.npz", "traces/.e.npz"]
