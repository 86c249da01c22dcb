"""A third benchmark needs no change outside its own code (docs/architecture.md, "A third
benchmark"): a toy counting benchmark, defined here and registered with
:func:`sera_core.envs.registry.register`, is played by the real runtime with the real expert
policy (delegation, rubrics, scores, counterfactual groups), takes its noisy-expert settings
from its class, and goes through the evaluator, the benchmark average and the report's run
loader."""

from __future__ import annotations

import asyncio
import json
import random
import re
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest

from sera_core.agents.actors import noisy_expert
from sera_core.agents.corpus import default_tokenizer
from sera_core.agents.runtime import Runtime, RuntimeConfig
from sera_core.course import eval_row
from sera_core.envs import DIFFICULTIES
from sera_core.envs.registry import BENCHMARKS, benchmark, register
from sera_core.eval.evaluator import EvalConfig, evaluate
from sera_core.judges import CountingJudge, JudgeVerdict
from sera_core.policy.expert import ExpertPolicy
from sera_core.report.runs import load_runs
from sera_core.rubrics import rubric_item
from sera_core.utils.jsonio import read_jsonl

REPLY = re.compile(r"<(add|delegate|finish)>(.*?)</\1>", re.S)


@dataclass
class Counter:
    value: int = 0


@dataclass
class AgentState:
    depth: int
    max_steps: int
    steps: int = 0
    finished: bool = False
    stopped: str | None = None
    finish_message: str = ""


class CountEnv:
    """One agent adding ``amount`` to a counter: ``<add>k</add>``, ``<delegate>k</delegate>``
    (a child adds k on the same counter), ``<finish>report</finish>``."""

    def __init__(self, world: Counter, amount: int, *, depth: int = 0, max_steps: int, max_depth: int,
                 child_max_steps: int, hook=None):
        self.world, self.amount, self.goal = world, amount, f"Add {amount} to the counter."
        self.state = AgentState(depth, max_steps)
        self.max_depth, self.child_max_steps, self.hook = max_depth, child_max_steps, hook
        self.children: list[CountEnv] = []

    @property
    def done(self) -> bool:
        s = self.state
        return s.finished or s.stopped is not None or s.steps >= s.max_steps

    @property
    def can_delegate(self) -> bool:
        return self.state.depth < self.max_depth

    def stop(self, reason: str) -> None:
        self.state.stopped = reason

    def result_text(self) -> str:
        return self.state.finish_message if self.state.finished else "(the sub-agent did not finish)"

    def child(self, world: Counter, amount: int) -> CountEnv:
        return CountEnv(world, amount, depth=self.state.depth + 1, max_steps=self.child_max_steps,
                        max_depth=self.max_depth, child_max_steps=self.child_max_steps, hook=self.hook)

    async def astep(self, reply: str) -> SimpleNamespace:
        self.state.steps += 1
        kind, arg = (m.groups() if (m := REPLY.search(reply)) else ("invalid", ""))
        if kind == "add" and arg.isdigit():
            self.world.value += int(arg)
            observation = f"Counter: {self.world.value}"
        elif kind == "delegate" and arg.isdigit() and self.can_delegate:
            observation = await self.hook(self, int(arg))
        elif kind == "finish":
            self.state.finished, self.state.finish_message, observation = True, arg, "Finished."
        else:
            observation = "Invalid reply."
        return SimpleNamespace(observation=observation)


@dataclass(frozen=True)
class CountExpertConfig:
    slip: float = 0.0
    """Noise: chance that an agent adds one less than it should."""


class CountExpert:
    """Delegates half of an amount of 2 or more when it may, adds the rest, finishes."""

    def __init__(self, amount: int, can_delegate: bool, slip: float, seed: int):
        half = amount // 2 if can_delegate and amount >= 2 else 0
        slipped = random.Random(seed).random() < slip
        self.plan = [f"<delegate>{half}</delegate>"] * bool(half)
        self.plan += [f"<add>{amount - half - slipped}</add>", f"<finish>added {amount}</finish>"]

    def act(self, observation: str | None) -> str:
        return self.plan.pop(0)


class CountJudge(CountingJudge):
    name = "toy_verifier"

    def judge(self, env: CountEnv) -> JudgeVerdict:
        finished = env.state.finished
        return self._record(JudgeVerdict(finished, "finished" if finished else "did not finish", self.name))


class ToyBenchmark:
    """Counting to a target; every member of the Benchmark protocol, nothing else."""

    name, title, short_title = "toy", "Toy counter", "Toy"
    agent_intro = "You add numbers to a shared counter. Reply with exactly one block:\n"
    agent_tools = "<add>k</add>  # add k to the counter\n<finish>message</finish>  # end with a report"
    delegate_tool = "<delegate>k</delegate>  # a child agent adds k to the same counter"
    measured_levels, measured_spread = ("easy",), False
    splits, eval_split, difficulties = ("test",), "test", DIFFICULTIES
    expert_modes, judges, sorted_keys = ("flat",), ("program",), False
    eval_counts, pool_weighted = {"easy": 5, "medium": 1, "hard": 1, "extreme": 1}, True
    stop, loop_repeats = ("</add>", "</delegate>", "</finish>"), None
    max_context_tokens, max_new_tokens = 4096, 32
    export_world = None

    def __init__(self, official: bool = False):
        self.official = official

    @staticmethod
    def generate_split(split: str, *, progress: bool = False, **options) -> list[dict]:
        return [{"task_id": f"count-{n}", "difficulty": DIFFICULTIES[(n - 1) // 3], "target": n} for n in range(1, 13)]

    @staticmethod
    def validate_record(record: dict, where: str = "record") -> None:
        if not isinstance(record.get("target"), int):
            raise ValueError(f"{where}: no target")

    @staticmethod
    def split_stats(records: list[dict]) -> dict:
        return {"tasks": len(records)}

    @staticmethod
    def task_id(record: dict) -> str:
        return record["task_id"]

    @staticmethod
    def solver(mode: str):
        def solve(record: dict) -> dict:
            env = ToyBenchmark.root_env(record, max_steps=1, max_depth=0, child_max_steps=1)
            asyncio.run(env.astep(f"<add>{record['target']}</add>"))
            passed, verdict = ToyBenchmark.root_result(env)
            return {"passed": passed, "reason": json.dumps(verdict), "agents": 1, "total_steps": env.state.steps,
                    "difficulty": record["difficulty"]}
        return solve, ("difficulty",)

    @staticmethod
    def demo_tasks(cfg) -> list[dict]:
        return []

    @staticmethod
    def vocabulary(seed: int = 0) -> list[str]:
        return ["Add 3 to the counter.", "Counter: 3"]

    @staticmethod
    def well_formed(text: str) -> bool:
        return REPLY.search(text) is not None

    @staticmethod
    def launch_spans(text: str) -> list[tuple[int, int]]:
        return [m.span() for m in REPLY.finditer(text) if m.group(1) == "delegate"]

    @staticmethod
    def make_judge(kind: str = "program", **options) -> CountJudge:
        return CountJudge()

    @staticmethod
    def expert_config(config: CountExpertConfig | None = None, *, explain: bool = False) -> CountExpertConfig:
        return config or CountExpertConfig()

    @staticmethod
    def noisy_expert_config(noise: float | None = None, **rates: float) -> CountExpertConfig:
        return replace(CountExpertConfig(slip=0.3 if noise is None else noise), **rates)

    @staticmethod
    def expert_agent(config: CountExpertConfig, info: dict) -> CountExpert:
        return CountExpert(info["amount"], info["can_delegate"], config.slip, info["seed"])

    @staticmethod
    def expert_rubric(info: dict) -> dict:
        items = [rubric_item("amount added", 0.7, f"The counter grew by {info['add']}.", "It did not.", "It did."),
                 rubric_item("finished", 0.1, "A report was given.", "No report.", "A report."),
                 rubric_item("valid replies", 0.1, "Every reply is one block.", "None is.", "All are."),
                 rubric_item("within budget", 0.1, "Steps remain at the end.", "None remain.", "Some remain.")]
        return {"rubric_items": items, "success_gate": f"the counter grew by {info['add']}",
                "failure_conditions": ["the counter grew by another amount"], "scoring_procedure": "gate, then items"}

    @staticmethod
    def expert_item_scores(outcome: dict, item_names: set[str]) -> tuple[bool, dict[str, float], str]:
        gate = outcome["added"] == outcome["asked"]
        return gate, {"amount added": float(gate)}, "added as asked" if gate else "added another amount"

    @staticmethod
    def expert_check(outcome: dict) -> str:
        return f"asked {outcome['asked']}, added {outcome['added']}"

    @staticmethod
    def perturbation(observation: str | None, info: dict, rng: random.Random) -> str:
        return "<add>0</add>"

    @staticmethod
    def after_mistake(held: str | None, current: str | None) -> str | None:
        return held

    @staticmethod
    def root_env(record: dict, *, max_steps: int, max_depth: int, child_max_steps: int) -> CountEnv:
        return CountEnv(Counter(), record["target"], max_steps=max_steps, max_depth=max_depth,
                        child_max_steps=child_max_steps)

    @staticmethod
    def root_result(env: CountEnv) -> tuple[bool, dict]:
        return env.world.value == env.amount, {"value": env.world.value, "target": env.amount}

    @staticmethod
    def install_hook(env: CountEnv, hook) -> None:
        env.hook = hook

    @staticmethod
    def goal(env: CountEnv) -> str:
        return env.goal

    @staticmethod
    def first_observation(env: CountEnv) -> str:
        return f"Counter: {env.world.value}"

    @staticmethod
    def spec_goal(parent: CountEnv, spec: int) -> str:
        return f"Add {spec} to the counter."

    @staticmethod
    def spawn(parent: CountEnv, spec: int) -> CountEnv:
        parent.children.append(child := parent.child(parent.world, spec))
        return child

    @staticmethod
    def fork_child(parent: CountEnv, spec: int) -> CountEnv:
        return parent.child(Counter(parent.world.value), spec)

    @staticmethod
    def commit(parent: CountEnv, branch: CountEnv) -> None:
        parent.world.value = branch.world.value

    @staticmethod
    def observable(env: CountEnv) -> str:
        return f"Counter: {env.world.value}"

    @staticmethod
    def final_state(env: CountEnv) -> str:
        return f"Counter: {env.world.value}"

    @staticmethod
    def world_json(env: CountEnv) -> dict:
        return {"value": env.world.value}

    @staticmethod
    def child_budget(parent: CountEnv, spec: int) -> str:
        return f"{parent.child_max_steps} steps."

    @staticmethod
    def spec_json(spec: int) -> dict:
        return {"add": spec}

    @staticmethod
    def start_facts(env: CountEnv) -> dict:
        return {"value": env.world.value}

    @staticmethod
    def outcome(env: CountEnv, start: dict, observations: list[str | None]) -> dict:
        return {"env": "toy", "asked": env.amount, "added": env.world.value - start["value"],
                "finished": env.state.finished, "steps": env.state.steps}

    @staticmethod
    def expert_info(env: CountEnv) -> dict:
        return {"amount": env.amount}


@pytest.fixture
def toy():
    """The scripted tokenizer as every other test has it (its corpus is taken before the toy
    joins the registry), and the toy registered for the test only."""
    tokenizer = default_tokenizer()
    register(ToyBenchmark)
    yield tokenizer
    BENCHMARKS.pop("toy")


def test_the_runtime_plays_the_toy_with_delegation_rubrics_scores_and_branch_groups(toy):
    tasks = benchmark("toy").generate_split("test")
    rollouts = Runtime("toy", ExpertPolicy(toy), RuntimeConfig(seed=0)).run(tasks)
    assert [r.tree.root_reward for r in rollouts] == [1.0] * 12
    big = rollouts[-1].tree  # adding 12: the root delegates 6, its child 3, its grandchild 1
    big.validate()
    assert [n.depth for n in big.nodes.values()] == [0, 1, 2, 3]
    children = [n for n in big.nodes.values() if n.depth > 0]
    assert all(n.rubric and n.score["final_score"] == 1.0 for n in children)
    assert "launch" in big.root.turns[0].roles and big.root.result["verdict"] == {"value": 12, "target": 12}
    noisy = Runtime("toy", noisy_expert(tokenizer=toy), RuntimeConfig(seed=0, counterfactual=4)).run(tasks[6:])
    points = [p for r in noisy for p in r.points]
    assert points and all(len(p.branches) == 4 and p.rubric for p in points)
    scores = {b.score.final_score for p in points for b in p.branches}
    assert {0.0, 1.0} <= scores  # a branch that slipped fails the gate: 0


def test_the_noisy_expert_and_the_cli_noise_come_from_the_toys_class(toy):
    assert noisy_expert(tokenizer=toy).configs["toy"] == CountExpertConfig(slip=0.3)
    assert noisy_expert(0.05, tokenizer=toy, toy={"slip": 0.9}).configs["toy"] == CountExpertConfig(slip=0.9)
    assert ExpertPolicy(toy).configs["toy"] == CountExpertConfig()


def test_the_evaluator_and_the_benchmark_average_take_the_toys_pool(toy, tmp_path):
    tasks = benchmark("toy").generate_split("test")
    summary = evaluate(tasks, noisy_expert(tokenizer=toy), tmp_path / "noisy", EvalConfig("toy", label="noisy toy"),
                       progress=False)
    rows = list(read_jsonl(tmp_path / "noisy" / "seed0.jsonl"))
    rates = {d: 100 * sum(r["success"] for r in rows if r["difficulty"] == d) / 3 for d in DIFFICULTIES}
    assert summary["by_difficulty"] == {d: {"mean": rates[d], "std": 0.0, "n": 1} for d in DIFFICULTIES}
    pooled = (5 * rates["easy"] + rates["medium"] + rates["hard"] + rates["extreme"]) / 8  # the toy's eval_counts
    assert summary["average"]["mean"] == pytest.approx(pooled)
    assert pooled != pytest.approx(sum(rates.values()) / 4)  # the weights matter here
    assert eval_row(summary)["average"] == pytest.approx(pooled)
    [run] = load_runs(tmp_path)
    assert (run.env, run.label) == ("toy", "noisy toy")
    assert json.loads((tmp_path / "noisy" / "summary.json").read_text())["env"] == "toy"


def test_the_cli_writes_and_solves_the_toys_tasks(toy, tmp_path, capsys):
    from sera_core.cli import main

    tasks = tmp_path / "toy.jsonl"
    assert main(["tasks", "--env", "toy", "--split", "test", "--difficulty", "hard", "--out", str(tasks)]) == 0
    assert main(["solve", "--env", "toy", "--tasks", str(tasks)]) == 0
    solved = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (solved["tasks"], solved["passed"], list(solved["by_difficulty"])) == (3, 3, ["hard"])
    # no world of its own to export (export_world None): not a choice of `sera world`
    assert main(["world", "--env", "toy", "--out", str(tmp_path / "world.json")]) == 2
    assert "invalid choice: 'toy' (choose from 'textcraft')" in capsys.readouterr().err


def test_register_refuses_a_taken_name_and_a_class_missing_a_hook_and_the_toy_leaves_no_trace():
    with pytest.raises(ValueError, match="registered already"):
        register(BENCHMARKS["textcraft"])
    members = {k: v for k, v in vars(ToyBenchmark).items() if k != "spawn" and not k.startswith("__")}
    with pytest.raises(ValueError, match=r"lacks the Benchmark members \['spawn'\]"):
        register(type("NoSpawn", (), {**members, "__init__": ToyBenchmark.__init__}))
    assert set(BENCHMARKS) == {"textcraft", "textworld"}
    with pytest.raises(ValueError, match="env must be one of"):
        benchmark("toy")
