"""Every experiment README says what its results.json says (experiments/runner/readme_check).

Reads files only: no experiment is rerun.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from experiments.runner.readme_check import quantities, readme_problems
from experiments.runner.render import END, START, markdown

ROOT = Path(__file__).resolve().parents[1] / "experiments"
SHIPPED = sorted(p.parent.name for p in ROOT.glob("*/experiment.toml"))

# Verdicts written before the number check quote numbers worked out by hand (ratios such as
# "−22%"), facts from outside the run ("0.3–0.5 GiB" per CUDA context) or numbers of an older
# run. The verdict rewrite of issue 15 declares (<!-- numbers: ... -->) or fixes them and takes
# the experiment off this list; strict, so a README that passes must leave it.
PENDING: set[str] = set()
# Verdicts whose numbers the binding check (issue 30: a number must be the subject's its clause
# names) cannot yet bind; strict, so a README that passes must leave it. None today.
PENDING_BINDING: set[str] = set()


@pytest.mark.parametrize("name", SHIPPED)
def test_the_results_section_is_what_results_json_renders(name: str) -> None:
    problems = [p for p in readme_problems(ROOT / name) if "the verdict's" not in p
                and "declared number" not in p]
    assert problems == []


@pytest.mark.parametrize("name", [pytest.param(
    name, marks=pytest.mark.xfail(strict=True, reason="verdict predates the number check"))
    if name in PENDING else pytest.param(
    name, marks=pytest.mark.xfail(strict=True, reason="a number not bound to its subject"))
    if name in PENDING_BINDING else name for name in SHIPPED])
def test_every_size_and_percentage_in_the_verdict_comes_from_the_results(name: str) -> None:
    assert readme_problems(ROOT / name) == []


GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture
def copy(tmp_path: Path) -> tuple[Path, int]:
    """An experiment folder: a shipped results.json, the section it renders, and a verdict
    quoting its first peak reserved (returned, in bytes) as GiB to two decimals."""
    folder = tmp_path / "fragmentation"
    folder.mkdir()
    shutil.copy(ROOT / "fragmentation" / "results.json", folder / "results.json")
    results = json.loads((folder / "results.json").read_text())
    peak = results["comparisons"][0]["results"][0]["peak_reserved"]
    (folder / "README.md").write_text(
        f"# x\n\n{START}\n{markdown(results)}\n{END}\n\n## Verdict\n\n"
        f"It reserves {peak / GiB:.2f} GiB.\n")
    assert readme_problems(folder) == []
    return folder, peak


def test_an_edited_table_fails(copy: tuple[Path, int]) -> None:
    folder, _ = copy
    readme = folder / "README.md"
    head, rest = readme.read_text().split(START, 1)
    body, tail = rest.split(END, 1)
    edited = body.replace(" yes ", " no  ", 1)
    assert edited != body
    readme.write_text(head + START + edited + END + tail)
    assert any("not what results.json renders" in p for p in readme_problems(folder))


def test_a_results_json_that_changed_fails(copy: tuple[Path, int]) -> None:
    folder, peak = copy
    results = folder / "results.json"
    data = json.loads(results.read_text())
    data["comparisons"][0]["results"][0]["peak_reserved"] = peak + 100 * MiB
    results.write_text(json.dumps(data))
    assert any("not what results.json renders" in p for p in readme_problems(folder))


def test_a_verdict_number_that_is_not_in_the_results_fails_until_declared(
        copy: tuple[Path, int]) -> None:
    folder, _ = copy
    readme = folder / "README.md"
    readme.write_text(readme.read_text() + "Saving +977.3% of 977 TiB.\n")
    assert readme_problems(folder) == [
        f"fragmentation: the verdict's {n} is in no table from results.json and not "
        "declared in <!-- numbers: ... -->" for n in ("977.3%", "977TiB")]
    readme.write_text(readme.read_text()
                      + "<!-- numbers: 977.3% (by hand), 977 TiB (a guess) -->\n")
    assert readme_problems(folder) == []
    readme.write_text(readme.read_text().replace("Saving +977.3% of 977 TiB.", ""))
    assert readme_problems(folder) == [
        "fragmentation: declared number 977.3% is not in the verdict",
        "fragmentation: declared number 977TiB is not in the verdict"]


def test_sizes_are_matched_at_the_precision_written_and_across_units(
        copy: tuple[Path, int]) -> None:
    folder, peak = copy
    readme = folder / "README.md"
    text = readme.read_text()
    quoted = f"{peak / GiB:.2f} GiB"
    shown = round(peak / GiB, 2)   # as the table prints it: numbers are held to that
    for written, ok in ((f"{shown:.1f} GiB", True), (f"{shown * 1024:.0f} MiB", True),
                        (f"{shown * 1024:.0f}MiB", True), ("977.31 GiB", False)):
        readme.write_text(text.replace(quoted, written))
        assert (readme_problems(folder) == []) is ok, written


def test_what_counts_as_a_quoted_number() -> None:
    found = [(q.text, q.unit) for q in quantities(
        "+14% → +1%, 12–47%, from 1.53 to 2.66 GiB, 954 vs 855 MiB, an A100-80GB, "
        "5,792 events, 1.12x slower, −22% (0B)")]
    assert found == [("14", "%"), ("1", "%"), ("12", "%"), ("47", "%"), ("1.53", "GiB"),
                     ("2.66", "GiB"), ("954", "MiB"), ("855", "MiB"), ("22", "%"), ("0", "B")]


def _swap_case(tmp_path: Path) -> tuple[Path, str, str, str]:
    """A folder with the shipped compilation results and a verdict quoting PyTorch's and
    BFC's peak reserved on its first comparison whose two numbers differ as printed."""
    folder = tmp_path / "compilation"
    folder.mkdir()
    shutil.copy(ROOT / "compilation" / "results.json", folder / "results.json")
    results = json.loads((folder / "results.json").read_text())
    from allocsim.policies import format_size
    for c in results["comparisons"]:
        reserved = {r["policy"]: format_size(r["peak_reserved"]) for r in c["results"]}
        bfc = next((p for p in reserved if p.startswith("jax") or p == "bfc"), None)
        if "pytorch" in reserved and bfc and reserved["pytorch"] != reserved[bfc]:
            break
    else:
        pytest.fail("no comparison where PyTorch's and BFC's peak reserved differ")
    label = c["trace"]["name"]

    def write(torch: str, bfc_size: str) -> None:
        (folder / "README.md").write_text(
            f"# x\n\n{START}\n{markdown(results)}\n{END}\n\n## Verdict\n\n"
            f"On {label}, PyTorch's allocator reserves {torch}, BFC {bfc_size}.\n")

    write(reserved["pytorch"], reserved[bfc])
    return folder, reserved["pytorch"], reserved[bfc], label


def test_a_planted_swap_of_two_policies_numbers_fails(tmp_path: Path) -> None:
    """The numbers are in the tables either way; bound to the policy each clause names, the
    swapped verdict is wrong and the check says so."""
    folder, torch, bfc, _ = _swap_case(tmp_path)
    assert readme_problems(folder) == []
    readme = folder / "README.md"
    text = readme.read_text()
    readme.write_text(text.replace(f"reserves {torch}, BFC {bfc}",
                                   f"reserves {bfc}, BFC {torch}"))
    problems = readme_problems(folder)
    assert len(problems) == 2 and all("not as the number of what its clause names" in p
                                      for p in problems), problems


def test_a_number_is_bound_to_the_trace_and_quantity_its_clause_names(tmp_path: Path) -> None:
    folder, torch, _, label = _swap_case(tmp_path)
    results = json.loads((folder / "results.json").read_text())
    other = next(c["trace"]["name"] for c in results["comparisons"]
                 if c["trace"]["name"] != label)
    readme = folder / "README.md"
    text = readme.read_text()
    # the same policy's number, said of another trace: wrong unless that trace has it too
    from allocsim.policies import format_size
    theirs = {format_size(r["peak_reserved"]) for c in results["comparisons"]
              if c["trace"]["name"] == other for r in c["results"] if r["policy"] == "pytorch"}
    if torch not in theirs:
        readme.write_text(text.replace(f"On {label},", f"On {other},"))
        assert any("not as the number" in p for p in readme_problems(folder))
    # a peak reserved said to be a utilization: wrong quantity
    readme.write_text(text.replace("PyTorch's allocator reserves",
                                   "PyTorch's allocator's utilization is"))
    assert any("not as the number" in p for p in readme_problems(folder))


def test_a_model_size_is_not_a_number_of_bytes() -> None:
    """"6.7B parameters" is no size: bytes are whole, so a decimal before B is a count."""
    assert [(q.text, q.unit) for q in quantities("the 6.7B step, 1.3B and 2351104B")] == [
        ("2351104", "B")]


# --- verdict words bound to the data (issue 40) ------------------------------------------------

def test_every_verdict_word_of_a_population_line_is_the_datas_verdict() -> None:
    from experiments.runner.verdict_words import verdict_word_problems
    assert verdict_word_problems(ROOT / "README.md") == []


def _summary_copy(tmp_path: Path, line: str) -> Path:
    """experiments/README.md's frame with one table line, beside a copy of one population."""
    (tmp_path / "arena_vs_growth").mkdir(parents=True)
    shutil.copy(ROOT / "arena_vs_growth" / "population.json",
                tmp_path / "arena_vs_growth" / "population.json")
    readme = tmp_path / "README.md"
    readme.write_text(f"| claim | answer | evidence |\n| --- | --- | --- |\n{line}\n")
    return readme


def test_supported_where_the_data_says_depends_fails(tmp_path: Path) -> None:
    from experiments.runner.verdict_words import verdict_word_problems
    claim = "XLA's compile-time plan needs less than BFC growing online"
    line = (f"| planning | **supported** <!-- claim: arena_vs_growth: {claim} --> on 8 of 9 | "
            "[arena_vs_growth](arena_vs_growth/README.md#findings) |")
    [problem] = verdict_word_problems(_summary_copy(tmp_path, line))
    assert "'depends' in population.json" in problem
    fixed = line.replace("**supported**", "**depends**")
    assert verdict_word_problems(_summary_copy(tmp_path / "b", fixed)) == []


def test_an_unbound_or_misbound_verdict_word_on_a_population_line_fails(tmp_path: Path) -> None:
    from experiments.runner.verdict_words import verdict_word_problems
    line = ("| planning | **depends** on the pattern; **supported** <!-- claim: arena_vs_growth: "
            "no such claim --> | [arena_vs_growth](arena_vs_growth/README.md#findings) |")
    problems = verdict_word_problems(_summary_copy(tmp_path, line))
    assert any("bound to no claim" in p for p in problems)
    assert any("has no claim 'no such claim'" in p for p in problems)


def test_the_check_command_holds_the_summarys_verdict_words(monkeypatch, capsys) -> None:
    from experiments import run as runner
    monkeypatch.setattr(runner, "summary_problems",
                        lambda path: [f"{path.name}:1: **supported** planted"])
    assert runner.main(["--check", "sharing"]) == 1
    assert "planted" in capsys.readouterr().out
