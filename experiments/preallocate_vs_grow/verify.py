"""Is a committed population what its definition makes? (issue 40: ``--verify`` did not cover
the populations behind three experiments' findings, and they had gone stale.)

Measuring a whole population takes minutes on many cores, too long for every check, so
:func:`population_regeneration_problems` checks everything that is cheap exactly and reruns a
sample of what is not:

- the definition: population.json names the digest of the population.toml it was measured
  from (``settings``: :func:`~experiments.preallocate_vs_grow.population.settings_digest`);
  an edited definition makes the stored population stale;
- the members: the families, member names and devices the definition yields now, in order;
- each member's data: its trace made again (generated from its seed and settings, or read
  from its file) has the stored fingerprint, peak live, event count and resolution, so no
  member was measured on other data than the definition names;
- the judgement: every claim judged again from the stored rows is the stored claim (counts,
  gaps, verdict word), and the README's population section is what the rows render;
- a rerun: the smallest member of each family measured again gives its stored row exactly.

``python -m experiments.run --all --verify`` runs it on each population beside the
experiments' regeneration; tests/test_experiments_regenerate.py holds it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

from experiments.preallocate_vs_grow import population as pop
from experiments.preallocate_vs_grow.member import fingerprint, measure_member
from experiments.preallocate_vs_grow.population import settings_digest
from experiments.runner.execute import resolution

# What a member's data is checked by: fields of its row that its trace alone decides.
DATA_FIELDS = ("peak_live", "events", "resolution", "fingerprint")


def population_regeneration_problems(folder: Path, *, rerun: bool = True) -> list[str]:
    """Everything in ``folder``'s population.json and README that its definition does not make
    (empty: none); ``rerun``: also measure the smallest member of each family again."""
    name = folder.name
    stored_path = folder / "population.json"
    if not stored_path.exists():
        return [f"{name}: population.json missing"]
    definition = tomllib.loads((folder / "population.toml").read_text())
    stored = json.loads(stored_path.read_text())
    problems = []
    if stored.get("settings") != settings_digest(definition):
        problems.append(f"{name}: population.json was measured from another population.toml "
                        f"(settings {stored.get('settings')!r}, the definition's "
                        f"{settings_digest(definition)!r})")
    work = pop.tasks(definition)
    expected = [(label, t.source.member, t.source.device) for label, t in work]
    found = [(f["label"], m["member"], m.get("device")) for f in stored["families"]
             for m in f["members"]]
    # A device is stored by its profile's name; the task names the profile it asks for.
    if [e[:2] for e in expected] != [f[:2] for f in found]:
        missing = [e[:2] for e in expected if e[:2] not in {f[:2] for f in found}]
        extra = [f[:2] for f in found if f[:2] not in {e[:2] for e in expected}]
        problems.append(f"{name}: the members are not the definition's (missing "
                        f"{missing[:3]}, not in the definition {extra[:3]})")
        return problems
    rows = [m for f in stored["families"] for m in f["members"]]
    smallest: dict[str, int] = {}
    for index, ((label, task), row) in enumerate(zip(work, rows)):
        trace = task.source.load()
        made = {"peak_live": int(trace.peak_live()[0]), "events": len(trace),
                "resolution": resolution("auto", trace), "fingerprint": fingerprint(trace)}
        differ = [k for k in DATA_FIELDS if row.get(k) != made[k]]
        if differ:
            problems.append(f"{name}: {label}: {row['member']}: the stored {', '.join(differ)} "
                            "is not its data's (measured on another trace)")
        if label not in smallest or made["events"] < rows[smallest[label]]["events"]:
            smallest[label] = index
    claims = [pop.judge(claim, stored["families"], stored["skipped"])
              for claim in definition.get("claims", [])]
    if claims != stored["claims"]:
        for old, new in zip(stored["claims"], claims):
            if old != new:
                problems.append(f"{name}: claim {new['text']!r} judged again from the stored "
                                f"rows is {new['verdict']} ({new['holds']}/{new['members']}), "
                                f"stored {old.get('verdict')} "
                                f"({old.get('holds')}/{old.get('members')})")
        if len(claims) != len(stored["claims"]):
            problems.append(f"{name}: the definition has {len(claims)} claims, population.json "
                            f"{len(stored['claims'])}")
    problems += pop.population_problems(folder)
    if rerun:
        for label, index in smallest.items():
            again = measure_member(work[index][1])
            if again != rows[index]:
                keys = sorted(k for k in {*again, *rows[index]}
                              if again.get(k) != rows[index].get(k))
                problems.append(f"{name}: {label}: {rows[index]['member']} measured again "
                                f"differs in {', '.join(keys)}")
    return problems
