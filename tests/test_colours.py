"""One colour per policy, distinct under normal vision and the three colour-vision deficiencies,
the same in every figure, the report and the experiments."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from allocsim.policies import DEFAULT_POLICIES
from allocsim.sim.output.colours import POLICY_COLOURS, SPARE_COLOURS, policy_colours

# Machado, Oliveira & Fernandes (2009), full severity, applied to linear RGB.
VISION = {
    "normal": np.eye(3),
    "protanopia": np.array([[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                            [-0.003882, -0.048116, 1.051998]]),
    "deuteranopia": np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                              [-0.011820, 0.042940, 0.968881]]),
    "tritanopia": np.array([[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.146700],
                            [0.004733, 0.691367, 0.303900]]),
}
BASE = ("offline", "preallocate", "on-demand", "cupy", "pytorch", "buddy", "best-fit", "bfc",
        "first-fit", "cuda-async")


def _linear(colour: str) -> np.ndarray:
    c = np.array([int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _lab(linear: np.ndarray) -> np.ndarray:
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                    [0.0193, 0.1192, 0.9505]]) @ np.clip(linear, 0, 1)
    xyz = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def worst_distance(a: str, b: str) -> float:
    """CIE76 ΔE between two colours, the smallest over the four kinds of vision."""
    return min(float(np.linalg.norm(_lab(m @ _linear(a)) - _lab(m @ _linear(b))))
               for m in VISION.values())


def test_the_base_policies_stay_far_apart_under_every_kind_of_vision() -> None:
    pairs = itertools.combinations(BASE, 2)
    assert min(worst_distance(POLICY_COLOURS[a], POLICY_COLOURS[b]) for a, b in pairs) >= 20


def test_every_named_colour_is_distinct_under_every_kind_of_vision() -> None:
    named = list(POLICY_COLOURS.values())
    assert len(set(named)) == len(named)
    assert min(worst_distance(a, b) for a, b in itertools.combinations(named, 2)) >= 10
    # dark enough to read on white: none near white
    assert all(_lab(_linear(c))[0] <= 78 for c in named + list(SPARE_COLOURS))


@pytest.mark.parametrize("a, b", [
    ("best-fit", "jax:allocator=platform"), ("pytorch:expandable_segments=true", "offline"),
    ("preallocate", "jax:preallocate=false"), ("jax", "pytorch:max_split_size_mb=128")])
def test_the_collisions_issue_29_found_are_gone(a: str, b: str) -> None:
    assert worst_distance(POLICY_COLOURS[a], POLICY_COLOURS[b]) >= 10


def test_an_unnamed_spec_never_borrows_a_named_colour_and_keeps_its_own_everywhere() -> None:
    specs = ["bfc:fraction=0.5", "pytorch:max_split_size_mb=64", "cupy:limit=1GiB"]
    one = policy_colours(["jax", *specs])
    other = policy_colours([*reversed(specs), "bfc", "pytorch"])
    assert not {one[s] for s in specs} & set(POLICY_COLOURS.values())
    assert all(one[s] == other[s] for s in specs)            # the same in every figure
    assert len({one[s] for s in specs}) == len(specs)
    assert policy_colours(list(DEFAULT_POLICIES)) == {p: POLICY_COLOURS[p]
                                                      for p in DEFAULT_POLICIES}


def test_no_figure_picks_its_own_policy_colours() -> None:
    """Every drawing takes policy colours from sim/output/colours.py."""
    root = Path(__file__).resolve().parents[1]
    sources = [path for folder in ("sim", "experiments", "benchmarks")
               for path in root.joinpath(folder).rglob("*.py")]
    for path in sources:
        text = path.read_text()
        if path.name == "colours.py":
            continue
        assert "POLICY_COLORS" not in text and "policy_colors(" not in text, path
        if "color=" in text and ("policy" in text):
            assert not re.search(r"#[0-9a-fA-F]{6}\b.*policy", text), path
