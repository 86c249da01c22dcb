"""The stage schedule: version -> stage mapping, ablations, counts, parsing errors, resume."""

from __future__ import annotations

import pytest

from sera_core.train.stages import DEFAULT_SCHEDULE, STAGE_ROLE, STAGES, Stage, StageController


def test_default_schedule_over_two_cycles() -> None:
    ctrl = StageController(DEFAULT_SCHEDULE)
    assert ctrl.schedule == "execution:16,delegation:2,rubric_generation:2"
    assert ctrl.cycle_length == 20
    expected = (["execution"] * 16 + ["delegation"] * 2 + ["rubric_generation"] * 2) * 2
    assert [ctrl.stage(v).name for v in range(40)] == expected
    assert [s.name for s in ctrl.stages(0, 40)] == expected
    assert ctrl.stage(15).name == "execution" and ctrl.stage(16).name == "delegation"
    assert ctrl.stage(18).name == "rubric_generation" and ctrl.stage(20).name == "execution"
    assert ctrl.stage(36).name == "delegation" and ctrl.stage(39).name == "rubric_generation"


def test_cycle_and_index_fields() -> None:
    ctrl = StageController(DEFAULT_SCHEDULE)
    assert ctrl.stage(0) == Stage("execution", "execution", 0, 0, False)
    assert ctrl.stage(17) == Stage("delegation", "launch", 0, 17, False)
    assert ctrl.stage(19) == Stage("rubric_generation", "rubric", 0, 19, True)
    assert ctrl.stage(20) == Stage("execution", "execution", 1, 0, False)
    assert ctrl.stage(58) == Stage("rubric_generation", "rubric", 2, 18, True)
    for v in range(60):
        s = ctrl.stage(v)
        assert (s.cycle, s.index) == divmod(v, 20)


def test_counterfactual_only_for_rubric_generation_and_roles() -> None:
    ctrl = StageController(DEFAULT_SCHEDULE)
    for s in ctrl.stages(0, 20):
        assert s.counterfactual == (s.name == "rubric_generation")
        assert s.role == STAGE_ROLE[s.name]
    assert STAGES == ("execution", "delegation", "rubric_generation")
    assert STAGE_ROLE == {"execution": "execution", "delegation": "launch", "rubric_generation": "rubric"}
    assert "score" not in STAGE_ROLE.values()


def test_single_stage_schedule() -> None:
    ctrl = StageController("execution:1")  # single-agent / RAO: execution only
    assert ctrl.cycle_length == 1
    assert {s.name for s in ctrl.stages(0, 25)} == {"execution"}
    assert ctrl.stage(7) == Stage("execution", "execution", 7, 0, False)


def test_dropped_stage() -> None:
    ctrl = StageController("execution:16,rubric_generation:2")
    assert ctrl.cycle_length == 18
    expected = (["execution"] * 16 + ["rubric_generation"] * 2) * 2
    assert [s.name for s in ctrl.stages(0, 36)] == expected
    assert ctrl.counts(36) == {"execution": 32, "delegation": 0, "rubric_generation": 4}


def test_custom_order_and_whitespace_kept() -> None:
    ctrl = StageController("  rubric_generation : 1 , execution:2,delegation:3 ")
    assert ctrl.schedule == "rubric_generation:1,execution:2,delegation:3"
    assert ctrl.parts == (("rubric_generation", 1), ("execution", 2), ("delegation", 3))
    names = ["rubric_generation", "execution", "execution", "delegation", "delegation", "delegation"]
    assert [s.name for s in ctrl.stages(0, 12)] == names * 2
    assert repr(ctrl) == "StageController('rubric_generation:1,execution:2,delegation:3')"


@pytest.mark.parametrize(
    "schedule", [DEFAULT_SCHEDULE, "execution:16,rubric_generation:2", "delegation:3,execution:5", "execution:1"]
)
def test_counts_equal_brute_force(schedule: str) -> None:
    ctrl = StageController(schedule)
    for versions in [0, 1, 5, 16, 17, 18, 19, 20, 21, 39, 40, 41, 57, 123]:
        brute = dict.fromkeys(STAGES, 0)
        for s in ctrl.stages(0, versions):
            brute[s.name] += 1
        assert ctrl.counts(versions) == brute, versions


def test_from_counts() -> None:
    assert StageController.from_counts(execution=16, delegation=2, rubric_generation=2).schedule == DEFAULT_SCHEDULE
    dropped = StageController.from_counts(rubric_generation=2, execution=16, delegation=0)
    assert dropped.schedule == "execution:16,rubric_generation:2"  # STAGES order, zero dropped
    with pytest.raises(ValueError, match="unknown stage"):
        StageController.from_counts(execution=1, planning=2)
    with pytest.raises(ValueError, match="'delegation' must be >= 0"):
        StageController.from_counts(execution=1, delegation=-1)
    with pytest.raises(ValueError, match="empty"):
        StageController.from_counts(execution=0)


@pytest.mark.parametrize(
    ("schedule", "match"),
    [
        ("", "schedule is empty"),
        ("   ", "schedule is empty"),
        ("execution:16,planning:2", "unknown stage 'planning'"),
        ("execution:16,execution:2", "'execution' appears more than once"),
        ("execution16", "part 'execution16' must be 'name:count'"),
        ("execution:16,", "part '' must be 'name:count'"),
        ("execution:two", "count 'two' in schedule part 'execution:two' is not an integer"),
        ("execution:1.5", "count '1.5' .* is not an integer"),
        ("execution:", "count '' .* is not an integer"),
        ("execution:0", "count '0' .* must be >= 1"),
        ("delegation:2,execution:-3", "count '-3' .* must be >= 1"),
    ],
)
def test_parse_errors(schedule: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StageController(schedule)


def test_negative_arguments_rejected() -> None:
    ctrl = StageController(DEFAULT_SCHEDULE)
    with pytest.raises(ValueError, match="version must be >= 0"):
        ctrl.stage(-1)
    with pytest.raises(ValueError, match="versions must be >= 0"):
        ctrl.counts(-1)
    with pytest.raises(ValueError, match="n must be >= 0"):
        ctrl.stages(0, -1)


def test_resume_continues_the_uninterrupted_sequence() -> None:
    uninterrupted = StageController(DEFAULT_SCHEDULE).stages(0, 70)
    for restart in [1, 15, 16, 17, 19, 20, 33, 58]:
        before = StageController(DEFAULT_SCHEDULE).stages(0, restart)
        after = StageController(DEFAULT_SCHEDULE).stages(restart, 70 - restart)  # a fresh controller, only the version kept
        assert before + after == uninterrupted, restart
