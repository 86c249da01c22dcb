"""Does a candidate warm start ship? The ``warmstart`` protocol's rule, applied by code.

Two folders written by :func:`sera_core.tiny.measure.measure_protocol` (``sera tiny measure
--protocol warmstart --save FOLDER``), one for the shipped adapter and one for the candidate,
are read side by side. For each of the protocol's ``measures`` (docs/protocol.md: root success,
well-formed act turns, greedy pairwise accuracy, trees solved) :func:`compare_measurements`
gives both values, the target, whether the candidate meets it, and whether it *beats* the
shipped adapter (strictly higher: a tie does not beat). Where the measure is success on the
same trees (root success, trees solved), the paired comparison comes with it: the trees each
adapter alone solved and the two-sided exact McNemar p-value
(:func:`~sera_core.eval.aggregate.mcnemar_exact`).

The rule, as the protocol states it: the candidate ships if it beats the shipped adapter on
most measures, read as *more than half* of them (4 of 6). Decision recorded here: "beats" is
the point estimate being higher, as the issue wrote the rule; the p-values stand beside it so
that a reader sees which wins are more than noise, but they do not decide.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sera_core.eval.aggregate import mcnemar_exact, paired_change
from sera_core.eval.protocol import load_protocol, protocol_hash
from sera_core.utils.errors import UserInputError
from sera_core.utils.jsonio import read_jsonl

PAIRED = ("root success", "trees solved of 32")
"""Measures read from trees solved or not: compared tree by tree."""


def measure_value(figures: dict[str, Any], measure: str) -> float | None:
    """One measure of one set's figures (a ``results.json`` entry of ``measure_protocol``):
    root success is the set's rate (its tasks are of one difficulty), the others a named figure."""
    if measure == "root success":
        rates = list(figures["success"].values())
        if len(rates) != 1:
            raise UserInputError(f"root success of a set of {len(rates)} difficulties is not one number")
        return rates[0]
    key = {"well-formed act turns": "well_formed", "greedy pairwise accuracy": "pairwise_accuracy",
           "trees solved of 32": "trees_solved"}.get(measure)
    if key is None:
        raise UserInputError(f"no figure for the measure {measure!r}")
    return figures.get(key)


def solved_trees(folder: Path, set_name: str) -> list[dict[str, Any]]:
    """One row per kept tree of a set (``SET.trees.jsonl``), ``{"task_id": tree_id, "success": solved}``:
    the rows :func:`~sera_core.eval.aggregate.paired_change` pairs."""
    return [{"task_id": row["tree"]["tree_id"], "success": (row["tree"]["root_reward"] or 0) >= 1}
            for row in read_jsonl(folder / f"{set_name}.trees.jsonl")]


def compare_measurements(shipped: str | os.PathLike, candidate: str | os.PathLike,
                         protocol: str = "warmstart") -> dict[str, Any]:
    """The protocol's measures for the ``candidate`` measurement folder against the ``shipped``
    one (module docstring). Both must have measured every set a measure reads under the
    protocol's current hash; anything else is refused, naming what is missing."""
    chosen = load_protocol(protocol)
    digest = protocol_hash(chosen)
    folders = {"shipped": Path(shipped), "candidate": Path(candidate)}
    results = {}
    for side, folder in folders.items():
        path = folder / "results.json"
        if not path.is_file():
            raise UserInputError(f"{path} does not exist: measure the {side} adapter first "
                                 f"(sera tiny measure --protocol {protocol} --save {folder})")
        results[side] = json.loads(path.read_text())
        if results[side]["protocol"]["hash"] != digest:
            raise UserInputError(f"{folder} was measured under protocol {results[side]['protocol']['hash']}, "
                                 f"not {chosen['name']} {digest}")
    rows = []
    for m in chosen["measures"]:
        missing = [side for side in folders if m["set"] not in results[side]["sets"]]
        if missing:
            raise UserInputError(f"set {m['set']} is not measured in {', '.join(str(folders[s]) for s in missing)}: "
                                 "rerun its measurement (it resumes)")
        value = {side: measure_value(results[side]["sets"][m["set"]], m["measure"]) for side in folders}
        row = {"set": m["set"], "measure": m["measure"], "target": m["target"], **value,
               "meets_target": value["candidate"] is not None and value["candidate"] >= m["target"],
               "beats_shipped": value["candidate"] is not None and (value["shipped"] is None
                                                                    or value["candidate"] > value["shipped"])}
        if m["measure"] in PAIRED:
            try:
                change = paired_change(solved_trees(folders["shipped"], m["set"]), solved_trees(folders["candidate"], m["set"]))
            except ValueError:
                raise UserInputError(f"set {m['set']}: the two folders do not hold the same trees") from None
            row["gained"], row["lost"] = change["gained"], change["lost"]
            row["mcnemar_p"] = round(mcnemar_exact(row["gained"], row["lost"]), 4)
        rows.append(row)
    beaten = sum(row["beats_shipped"] for row in rows)
    return {"protocol": {"name": chosen["name"], "hash": digest}, "rule": chosen["rule"],
            "policies": {side: results[side]["policy"] for side in folders},
            "adapters": {side: results[side].get("adapter") for side in folders},
            "measures": rows, "beaten": beaten, "of": len(rows), "ships": beaten > len(rows) / 2}


def verdict_table(verdict: dict[str, Any]) -> str:
    """The comparison as a markdown table, with the rule's outcome in its last line."""
    lines = ["| measure | set | shipped | candidate | target | beats shipped | paired (gained/lost, McNemar p) |",
             "|---|---|---|---|---|---|---|"]

    def show(x: float | None) -> str:
        return "n/a" if x is None else f"{x:g}" if float(x).is_integer() else f"{x:.3f}"

    for row in verdict["measures"]:
        paired = f"{row['gained']}/{row['lost']}, p = {row['mcnemar_p']:g}" if "mcnemar_p" in row else ""
        lines.append(f"| {row['measure']} | `{row['set']}` | {show(row['shipped'])} | {show(row['candidate'])} | "
                     f"{show(row['target'])} | {'yes' if row['beats_shipped'] else 'no'} | {paired} |")
    from sera_core.tiny.measure import adapter_words

    lines.append("\n" + "; ".join(f"{side}: `{verdict['policies'][side]}`, {adapter_words(verdict['adapters'][side])}"
                                  for side in ("shipped", "candidate")) + ".")
    lines.append(f"\nThe candidate beats the shipped adapter on {verdict['beaten']} of {verdict['of']} measures: "
                 f"it {'ships' if verdict['ships'] else 'does not ship'} ({verdict['rule']}).")
    return "\n".join(lines)


SHIPPED_FILES = ("adapter_config.json", "adapter_model.safetensors", "manifest.json")
"""What an adapter folder ships with (the build's folder may hold nothing else that ships)."""


def ship(candidate: str | os.PathLike, shipped: str | os.PathLike, protocol: str = "warmstart", *,
         to: str | os.PathLike | None = None) -> dict[str, Any]:
    """Apply the protocol's rule to two measurement folders (:func:`compare_measurements`) and,
    when the candidate ships, put its adapter in the place of the shipped one (``to``, default
    :data:`~sera_core.policy.models.EMBEDDED`), whole or not at all
    (:func:`~sera_core.utils.folders.swap_in`). The adapter is the folder the candidate
    measurement played (its policy ``vllm:FOLDER``); its manifest's ``results`` become that
    measurement's figures per set (notebook 00 shows them) with a ``note`` naming the protocol
    and its hash. A candidate built from no recipe of :data:`~sera_core.tiny.warmstart.RECIPES`
    is refused before anything moves, and so is an adapter folder whose weights are no longer
    the ones the candidate measurement recorded (:func:`~sera_core.tiny.measure.measured_adapter`).
    Returns the verdict with ``shipped`` (whether the adapter moved) and, when it did, ``to``."""
    import shutil

    from sera_core.policy.models import EMBEDDED, adapter_identity, model_folder
    from sera_core.tiny.measure import adapter_words
    from sera_core.tiny.warmstart import read_manifest, shipped_recipe, write_manifest
    from sera_core.utils.folders import swap_in

    verdict = compare_measurements(shipped, candidate, protocol)
    if not verdict["ships"]:
        return verdict | {"shipped": False}
    spec = verdict["policies"]["candidate"]
    folder = model_folder(spec.partition(":")[2] or spec)  # vllm:FOLDER or hf:FOLDER, as make_actor reads it
    missing = [name for name in SHIPPED_FILES if not (folder / name).is_file()]
    if missing:
        raise UserInputError(f"{folder} (the candidate measurement's policy) lacks {', '.join(missing)}")
    recipe = shipped_recipe(folder)  # refused here when the code no longer holds its recipe
    held = adapter_identity(folder)  # the weights there now, hashed once
    if held != verdict["adapters"]["candidate"]:
        raise UserInputError(f"{folder} holds {adapter_words(held)}, but {candidate} measured "
                             f"{adapter_words(verdict['adapters']['candidate'])}: measure what is there before shipping it")
    measured = json.loads((Path(candidate) / "results.json").read_text())
    manifest = read_manifest(folder)
    manifest["results"] = {**measured["sets"], "note": (
        f"measured under the frozen {verdict['protocol']['name']} protocol (hash {verdict['protocol']['hash']}, "
        f"docs/protocol.md) by `sera tiny measure --protocol {protocol}`: one entry per set, its role beside it; "
        f"it beat the adapter shipped before it on {verdict['beaten']} of {verdict['of']} measures ({verdict['rule']})")}
    to = Path(to) if to is not None else EMBEDDED
    tmp = to.with_name(to.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in SHIPPED_FILES:
        if name != "manifest.json":  # written below, with the measured figures
            shutil.copy2(folder / name, tmp / name)
    write_manifest(tmp, manifest)
    swap_in(tmp, to)
    return verdict | {"shipped": True, "to": str(to), "recipe_hash": recipe.config_hash()}
