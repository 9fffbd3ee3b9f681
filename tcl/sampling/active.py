"""Active collection on a real device: generate candidate programs, let a sampler choose, measure
only the chosen (`tcl collect --sample STRATEGY --budget N`).

    summary = collect_active(platform, tasks, out, ActiveSettings("rdu", budget=64, rounds=4))

Per task, MetaSchedule draws `pool_size` candidate programs with the seed `tcl collect` uses
(the same programs a plain collection of that many trials would measure), nothing measured.
They are featurized from their traces (tcl.records.metaschedule -> tcl.features) into one
:class:`Pool` over all tasks of the run. Each round, the sampler chooses its share of the budget
(``Sampler.select`` with everything measured so far as ``known``), only those programs are built
and run (tcl.collect.measure, the builder/runner path and quiet-CPU guard of `tcl collect`) and
committed to the normal MetaSchedule database, and their latencies are revealed; the next round
retrains on everything measured. Unchosen programs are never measured: no label of theirs exists.

Resuming: the database is the truth for what is measured (any program of the pool it holds is
known, whoever measured it), and ``active.json`` beside it (written atomically) keeps the programs
measured, those chosen but not yet measured, and the round log. Rerunning with the same settings measures the
pending programs first, then chooses again until the (possibly larger) budget is spent. Each
round retrains from the given model (or from scratch) on what is measured before it, with the
round's own seeds: a resumed run's rounds see what an uninterrupted run's would.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tcl.collect.collector import CHUNK, record_settings, record_task
from tcl.collect.measure import (
    FAILED_RUN_SECS,
    GuardedRunner,
    MeasureSettings,
    RpcSettings,
    build_all,
    commit,
    existing_latencies,
    make_builder,
    open_database,
    remove_artifacts,
    run_all,
    sample_programs,
    wait_for_quiet_cpu,
)
from tcl.collect.networks import Task
from tcl.collect.workloads import task_description, task_module
from tcl.hardware import Platform, require_measurable
from tcl.io import atomic_write_json
from tcl.sampling import STRATEGIES, Pool, SampleSettings, SamplingError, make_sampler
from tcl.sampling.base import given_members, split_budget

STATE_FILE = "active.json"
STATE_VERSION = 1
# what must not change between a run and its resumption (they fix the pool and its numbering)
POOL_KEYS = ("platform", "strategy", "seed", "pool_size", "tasks")


@dataclass
class ActiveSettings:
    strategy: str                 # a tcl.sampling strategy (rdu, random, ...)
    budget: int                   # programs measured in all (the pool's programs already in the database count)
    rounds: int = 3               # choose -> measure -> retrain rounds the budget is split over
    pool_size: int = 256          # candidate programs generated per task
    seed: int = 0                 # seeds the candidates (as `tcl collect --seed`) and the sampler
    max_len: int = 48             # steps kept per program (params.yaml featurize.max_len)


@dataclass
class Candidates:
    """The generated programs of every task and their pool (features, tasks; no labels)."""

    mods: list                    # per task: its IRModule
    hashes: list[str]             # per task: its structural hash (the database's workload key)
    programs: list                # per pool row: (task index, Schedule, program id)
    pool: Pool
    dropped: int                  # candidates whose trace has no step features (never offered)
    short_tasks: dict             # task name -> candidates drawn, where its design space had fewer than asked


def generate_candidates(tasks: list[Task], platform: Platform, pool_size: int, seed: int, max_len: int) -> Candidates:
    """`pool_size` distinct programs per task (fewer for a small design space), featurized."""
    from tvm_ffi import structural_hash

    from tcl.features import Featurizer
    from tcl.records.metaschedule import trace_to_steps

    mods, programs, steps, dropped, short = [], [], [], 0, {}
    for t_index, task in enumerate(tasks):
        mod = task_module(task)
        mods.append(mod)
        # the seed `tcl collect` gives task t_index: a plain collection draws the same programs
        drawn = sample_programs(mod, platform.target, pool_size, seed=seed * 1000 + t_index)
        if len(drawn) < pool_size:
            short[task.name] = len(drawn)
        for sch, trace_json, pid in drawn:
            # plain JSON values, as the database file holds them (TVM's strings are str subclasses,
            # which the reader's fast type checks do not take for strings)
            program_steps = trace_to_steps(json.loads(json.dumps(trace_json)))
            if isinstance(program_steps, str):  # an instruction the featurizer does not know
                dropped += 1
                continue
            programs.append((t_index, sch, pid))
            steps.append(program_steps)
    featurizer = Featurizer(max_len)
    x, mask = featurizer(steps)
    pool = Pool(x=x, mask=mask, task=np.asarray([t for t, _, _ in programs], np.int32), task_info={
        "tasks": [t.name for t in tasks], "task_desc": [task_description(t) for t in tasks],
        "task_weight": np.asarray([t.weight for t in tasks], np.float64),
        "task_networks": [list(t.networks) for t in tasks],
        "task_network_weights": [dict(t.weights) for t in tasks], "platform": platform.name,
        "meta": featurizer.meta, "program_id": np.asarray([pid for _, _, pid in programs], dtype=str)})
    return Candidates(mods, [str(structural_hash(m)) for m in mods], programs, pool, dropped, short)


def round_plan(budget: int, rounds: int, measured: int) -> list[tuple[int, int]]:
    """(round index, programs to choose) of the rounds still to run: `budget` split over `rounds`
    as a fresh run would, less the `measured` programs (which fill the first rounds)."""
    plan, end = [], 0
    for r, size in enumerate(split_budget(budget, rounds)):
        start, end = end, end + size
        if end > measured:
            plan.append((r, end - max(start, measured)))
    return plan


class ActiveCollection:
    """One platform's database, its candidate pool and state; measures the programs chosen."""

    def __init__(self, platform: Platform, tasks: list[Task], out: Path, active: ActiveSettings,
                 settings: MeasureSettings, rpc: RpcSettings | None, progress: bool):
        self.platform, self.out, self.active = platform, out, active
        self.settings, self.rpc = settings, rpc
        self.tasks = tasks
        self.state = self._load_state()  # first: a mismatched resumption fails before any work
        self.db = open_database(out)
        self.cand = generate_candidates(tasks, platform, active.pool_size, active.seed, active.max_len)
        self.row_of = {pid: i for i, (_, _, pid) in enumerate(self.cand.programs)}
        # the pool's programs the database already holds: row -> latency
        self.known: dict[int, float] = {}
        for mod in self.cand.mods:
            for pid, secs in existing_latencies(self.db, mod).items():
                if pid in self.row_of:
                    self.known[self.row_of[pid]] = secs
        self.builder = None
        self.runner = None
        self.failed: Counter = Counter()
        self.measured_now = 0
        self.waited_s = 0.0
        from tqdm import tqdm

        self.bar = tqdm(total=active.budget, initial=min(len(self.known), active.budget), disable=not progress,
                        unit="meas", desc=f"collect ({active.strategy})")

    # -- state -------------------------------------------------------------------------------
    def _identity(self) -> dict:
        a = self.active
        return {"platform": self.platform.name, "strategy": a.strategy, "seed": a.seed,
                "pool_size": a.pool_size, "tasks": [t.name for t in self.tasks]}

    def _load_state(self) -> dict:
        path = self.out / STATE_FILE
        ident = self._identity()
        if not path.exists():
            return {"version": STATE_VERSION, **ident, "pending": [], "rounds": []}
        try:
            state = json.loads(path.read_text())
        except ValueError as exc:
            raise SamplingError(f"{path}: not a readable active-collection state ({exc})") from None
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise SamplingError(f"{path}: not an active-collection state of version {STATE_VERSION}")
        for key in POOL_KEYS:
            if state.get(key) != ident[key]:
                raise SamplingError(f"{path}: this collection was started with {key} = {state.get(key)!r}, "
                                    f"now {ident[key]!r}; resume with the same settings or use another --out")
        return state

    def save_state(self, pending: list[int]) -> None:
        self.state.update(budget=self.active.budget, rounds_planned=self.active.rounds,
                          pool=len(self.cand.programs),
                          measured=sorted(self.cand.programs[i][2] for i in self.known),
                          pending=[self.cand.programs[i][2] for i in pending])
        atomic_write_json(self.out / STATE_FILE, self.state)

    # -- measuring ---------------------------------------------------------------------------
    def measure(self, rows: np.ndarray) -> np.ndarray:
        """Build, run and commit pool rows `rows` (the chosen ones); their latencies in seconds
        (FAILED_RUN_SECS for a failed build or run: the program is measured, and useless)."""
        rows = [int(i) for i in rows]
        todo = [i for i in rows if i not in self.known]
        self.save_state(pending=todo)
        if self.builder is None:
            self.builder = make_builder(self.settings)
            self.runner = GuardedRunner(self.platform.threads or 1, self.settings, self.rpc)
        # a round spreads over many tasks, a few programs each: build and run them together (each
        # build call starts its own worker pool, seconds that would otherwise be paid per task)
        for a in range(0, len(todo), CHUNK):
            chunk = todo[a:a + CHUNK]
            scheds = [self.cand.programs[i][1] for i in chunk]
            builds = build_all(self.builder, [s.mod for s in scheds], self.platform.target)
            if self.rpc is None:
                os.environ["TVM_NUM_THREADS"] = str(self.platform.threads or 1)
                self.waited_s += wait_for_quiet_cpu(self.settings)
            outcomes = run_all(self.runner, [s.mod for s in scheds], builds, self.platform.target)
            for i, sch, (secs, err) in zip(chunk, scheds, outcomes):
                commit(self.db, self.cand.mods[self.cand.programs[i][0]], sch.trace, secs, self.platform.target)
                self.known[i] = sum(secs) / len(secs) if secs else FAILED_RUN_SECS
                self.measured_now += 1
                if err:  # "build: ..." / "run: ...": count by stage and TVM's last line
                    stage, _, last = err.partition(": ")
                    self.failed[f"{stage}: {last[:80]}"] += 1
            remove_artifacts(builds)
            self.bar.update(len(chunk))
            self.save_state(pending=[i for i in todo if i not in self.known])
        return np.asarray([self.known[i] for i in rows], np.float64)

    def known_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(sorted(self.known), np.int64)
        return rows, np.asarray([self.known[i] for i in rows], np.float64)


def collect_active(platform: Platform, tasks: list[Task], out: str | os.PathLike, active: ActiveSettings,
                   sample_settings: SampleSettings | None = None, model=None,
                   settings: MeasureSettings | None = None, rpc: RpcSettings | None = None,
                   progress: bool = True) -> dict:
    """Measure `active.budget` programs of `tasks` on `platform` chosen by `active.strategy` from
    `active.pool_size` candidates per task, into the MetaSchedule database `out` (resumable).

    `model` (a CostModel, e.g. the family's KB, or a list of them: an ensemble) serves embedding
    and uncertainty from the first round; without one the first round is cold (RDU:
    representativeness + diversity). Returns
    counts: measured now, present before, failed by reason, the pool, and the rounds run now.
    """
    settings = settings or MeasureSettings()
    require_measurable(platform, here=rpc is None)
    if active.strategy not in STRATEGIES:
        raise SamplingError(f"unknown sampling strategy {active.strategy!r}; choose one of {', '.join(STRATEGIES)}")
    for key in ("budget", "rounds", "pool_size"):
        if int(getattr(active, key)) < 1:
            raise SamplingError(f"{key} must be >= 1, got {getattr(active, key)}")
    from tcl.features import FeatureKindError, Featurizer
    from tcl.models.base import PerStoreCostModel

    featurizer = Featurizer(active.max_len)  # what the candidates will be featurized with
    for member in given_members(model):
        if isinstance(member, PerStoreCostModel):
            raise SamplingError(f"active collection scores step features; model kind {member.kind!r} "
                                "reads MetaSchedule's per-store features")
        try:
            member.check_step_features(featurizer.meta, featurizer.n_features)
        except FeatureKindError as exc:
            raise SamplingError(f"the model cannot score the candidates: {exc}") from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    run = ActiveCollection(platform, tasks, out, active, settings, rpc, progress)
    pool_n = len(run.cand.programs)
    if active.budget > pool_n:
        raise SamplingError(f"budget {active.budget} exceeds the pool: {pool_n} candidate programs "
                            f"({len(tasks)} task(s), --pool-size {active.pool_size}); raise --pool-size")
    record_settings(out, platform, settings, active.seed, rpc)
    for task, shash in zip(tasks, run.cand.hashes):
        record_task(out, shash, task)
    present = len(run.known)

    # a round interrupted while measuring: finish the programs it chose before choosing again
    pending = [run.row_of[p] for p in run.state.get("pending", []) if p in run.row_of]
    pending = [i for i in pending if i not in run.known][:max(0, active.budget - len(run.known))]
    if pending:
        run.measure(np.asarray(pending, np.int64))

    sampler = make_sampler(active.strategy, sample_settings, seed=active.seed, rounds=1)
    rounds_now, sampler_s = [], 0.0
    for r, size in round_plan(active.budget, active.rounds, len(run.known)):
        r = max(r, len(run.state["rounds"]))  # rounds keep their own seeds across a larger rerun
        known_rows, known_lat = run.known_arrays()
        selection = sampler.select(run.cand.pool, size, run.measure, model=model,
                                   known=(known_rows, known_lat), first_round=r)
        record = {**selection.rounds[0], "seconds": round(selection.seconds, 3),
                  "programs": [run.cand.programs[int(i)][2] for i in selection.indices]}
        run.state["rounds"].append(record)
        rounds_now.append({k: v for k, v in record.items() if k != "programs"})
        sampler_s += selection.seconds
        run.save_state(pending=[])
    run.save_state(pending=[])
    run.bar.close()
    guard = {"runner_restarts": 0, "hung_runs": 0}  # what the runner's guard did
    if run.runner is not None:
        guard = {"runner_restarts": run.runner.restarts, "hung_runs": run.runner.hung}
        run.runner.close()
    return {"platform": platform.name, "tasks": len(tasks), "strategy": active.strategy,
            "pool": pool_n, "dropped": run.cand.dropped, "short_tasks": run.cand.short_tasks,
            "budget": active.budget,
            "measured": run.measured_now, "present": present, "failed": dict(run.failed),
            "rounds": rounds_now, "sampler_seconds": round(sampler_s, 3),
            "waited_for_quiet_cpu_s": run.waited_s, **guard, "settings": asdict(active)}
