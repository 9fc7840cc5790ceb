"""The Ray executor on a local Ray cluster, with CPU-only stand-in evaluations.

The cluster is a head with no GPU and two worker nodes that each declare one (fake)
GPU, so `num_gpus=1` actors schedule here and land on different nodes, as on a real
cluster. The stand-in answers from the candidate's params (no build, no GPU) and can
sleep, or kill its own worker process, to stand for slow and crashing evaluations.
Without Ray installed only the no-Ray test runs.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kfbot.anticheat.adequacy import Adequacy
from kfbot.config import load_config
from kfbot.errors import EXIT_MISSING_TOOL, KfbotError
from kfbot.evaluate.build import Builder
from kfbot.evaluate.candidate import ORIGINAL, Candidate
from kfbot.evaluate.engine import Engine, EngineSettings
from kfbot.evaluate.evaluation import Evaluation
from kfbot.evaluate.task import KernelTask, make_task
from kfbot.scan.scanner import scan
from kfbot.scan.select import select_kernel
from kfbot.search.executors.ray import RayExecutor, pack_source, place_source, ray_module

# A hang (an actor that never gets a GPU) fails the test instead of stalling the run.
pytestmark = pytest.mark.timeout(300)

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "example"
KERNEL = "csrc/softmax.cu"


class StandIn:
    """Evaluates from params, reading the kernel source from the task's root on the node."""

    def __init__(self, task: KernelTask, settings: EngineSettings) -> None:
        self.source = (task.root / KERNEL).read_bytes()

    def evaluate_many(self, candidates: Sequence[Candidate]
                      ) -> Iterator[tuple[Candidate, Evaluation]]:
        for cand in candidates:
            started = time.monotonic()
            _misbehave(cand.params)
            ev = expected(cand, self.source)
            yield cand, Evaluation(ev.candidate, ev.stage, ev.ok, ev.reason,
                                   environment={"pid": os.getpid(), "started": started,
                                                "ended": time.monotonic()})

    def probe(self) -> dict[str, Any]:
        return {"cuda": True, "gpu": "stand-in", "pid": os.getpid()}

    def baseline(self) -> Evaluation:
        return Evaluation(ORIGINAL.hash, "done", True, "the original passes its reference")

    def adequacy(self) -> Adequacy | None:
        return None

    def __exit__(self, *exc: object) -> None:
        pass


class NoGpu(StandIn):
    def probe(self) -> dict[str, Any]:
        raise KfbotError("no CUDA GPU: torch sees none", EXIT_MISSING_TOOL)


class Probing(StandIn):
    """Leaves a mark named after its process each time it probes its device."""

    def __init__(self, task: KernelTask, settings: EngineSettings) -> None:
        super().__init__(task, settings)
        self.marks = settings.cache_dir / "probed"

    def probe(self) -> dict[str, Any]:
        self.marks.mkdir(parents=True, exist_ok=True)
        (self.marks / str(os.getpid())).write_text("probed")
        return super().probe()


class Building(StandIn):
    """Builds each candidate for real, in a build cache of its own (the GPU node's),
    and says how many objects it compiled and how many it found there already."""

    def __init__(self, task: KernelTask, settings: EngineSettings) -> None:
        super().__init__(task, settings)
        self.builder = Builder(settings.cache_dir / "gpu-node" / "build")
        self.engine = Engine(task, settings, self.builder)

    def evaluate_many(self, candidates: Sequence[Candidate]
                      ) -> Iterator[tuple[Candidate, Evaluation]]:
        for cand in candidates:
            built = self.engine.build(cand)
            yield cand, Evaluation(cand.hash, "done", True,
                                   f"compiled {built.compiled}, reused {built.reused}")


def failing_build(*args: Any) -> list[bytes]:
    raise RuntimeError("this build node broke")


def _misbehave(params: Any) -> None:
    time.sleep(float(params.get("SLEEP", 0)))
    if params.get("CRASH") == "always":
        os._exit(1)
    marker = params.get("CRASH_ONCE")
    if marker and not Path(marker).exists():
        Path(marker).write_text("crashed here once")
        os._exit(1)


def expected(cand: Candidate, source: bytes) -> Evaluation:
    digest = hashlib.sha256(source).hexdigest()[:12]
    block = int(cand.params.get("BLOCK", "0"))
    return Evaluation(cand.hash, "done", block % 64 == 0, f"block {block}, source {digest}")


def same(ev: Evaluation, want: Evaluation) -> bool:
    return (ev.candidate, ev.stage, ev.ok, ev.reason) == (want.candidate, want.stage,
                                                          want.ok, want.reason)


def blocks(*values: int, **extra: str) -> list[Candidate]:
    return [Candidate(params={"BLOCK": str(v), **extra}, origin="params") for v in values]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # The stand-in lives in this file: Ray's workers import it from here.
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), *filter(None, [old])])
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    for _ in range(2):
        nodes.add_node(num_cpus=2, num_gpus=1)
    ray.init(address=nodes.address, include_dashboard=False, log_to_driver=False)
    yield nodes
    ray.shutdown()
    nodes.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH")
    else:
        os.environ["PYTHONPATH"] = old


@pytest.fixture(autouse=True)
def _gpus_free(request: pytest.FixtureRequest) -> None:
    """Each cluster test starts with every GPU free: a test's actors are killed as it
    ends, but Ray hands their GPUs back a moment later, and an executor made before
    then would wait for ever on an actor with no GPU to run on."""
    if "cluster" not in request.fixturenames:
        return
    request.getfixturevalue("cluster")  # up first: asking an idle Ray would start one
    ray = ray_module()
    deadline = time.monotonic() + 60
    while True:
        total = ray.cluster_resources().get("GPU", 0)
        free = ray.available_resources().get("GPU", 0)
        if free >= total:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"the cluster's GPUs stayed busy: {free:g} of {total:g} free")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def task() -> KernelTask:
    config = load_config(None, FIXTURE)
    return make_task(select_kernel(scan(FIXTURE, config).kernels, "softmax_kernel"),
                     FIXTURE, config)


def executor(task: KernelTask, tmp_path: Path, **options: Any) -> RayExecutor:
    options.setdefault("factory", StandIn)
    return RayExecutor(task, EngineSettings(cache_dir=tmp_path / "cache"), None, **options)


def test_the_preflight_runs_on_an_actor(cluster: Any, task: KernelTask, tmp_path: Path) -> None:
    run = executor(task, tmp_path)
    try:
        facts = run.preflight()
    finally:
        run.close()
    assert facts.device["pid"] != os.getpid() and facts.device["gpu"] == "stand-in"
    assert facts.baseline.ok and facts.adequacy() is None
    assert facts.node in {n["NodeID"] for n in cluster_nodes()}


def test_the_preflight_starts_every_actor(cluster: Any, task: KernelTask,
                                         tmp_path: Path) -> None:
    run = executor(task, tmp_path, factory=Probing)
    try:
        run.preflight()
        probed = sorted(p.name for p in (tmp_path / "cache" / "probed").iterdir())
        evaluated = run.evaluate(blocks(64, 128, 192, 256))  # chunks go to both actors
        actors = len(run.actors)
    finally:
        run.close()
    assert actors == 2 and len(probed) == 2
    # Each says how long its chunk took to prepare and then waited for the GPU.
    assert all({"actor-prepare", "actor-gpu-wait"} <= set(ev.phases) for _, ev in evaluated)
    assert {ev.environment["pid"] for _, ev in evaluated} == {int(pid) for pid in probed}


def test_a_preflight_failure_says_it_came_from_the_actor(cluster: Any, task: KernelTask,
                                                          tmp_path: Path) -> None:
    run = executor(task, tmp_path, factory=NoGpu)
    try:
        with pytest.raises(KfbotError, match="on the Ray actor: no CUDA GPU") as caught:
            run.preflight()
    finally:
        run.close()
    assert caught.value.exit_code == EXIT_MISSING_TOOL


def test_builds_on_cpu_tasks_fill_the_gpu_actors_cache(cluster: Any, task: KernelTask,
                                                       tmp_path: Path) -> None:
    batch = [Candidate(params={"BLOCK": "64"}, origin="params")]
    run = executor(task, tmp_path, factory=Building, build_cpus=1)
    try:
        (_, ev), = run.evaluate(batch)
    finally:
        run.close()
    # Objects compile here; linking needs a CUDA build of torch, so on a machine
    # without one the module is left to the GPU node.
    compiled, reused = (int(n) for n in re.findall(r"\d+", ev.reason))
    assert (compiled, reused) == (0, 4), ev.reason
    assert (tmp_path / "cache" / "build" / "objects").is_dir()  # the build task's cache


def test_a_failed_build_task_leaves_the_build_to_the_actor(cluster: Any, task: KernelTask,
                                                            tmp_path: Path) -> None:
    batch = blocks(64, 96)
    run = executor(task, tmp_path, build_cpus=1, build_task=failing_build)
    try:
        results = run.evaluate(batch)
    finally:
        run.close()
    source = (FIXTURE / KERNEL).read_bytes()
    assert all(same(ev, expected(c, source)) for c, ev in results)


def test_optimize_on_ray_asks_the_cluster_for_its_gpu(cluster: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The driver runs no GPU work of its own: the probe is an actor's, and here the
    cluster's (stand-in) GPUs are not real, so the actor's worker finds no CUDA."""
    from kfbot.cli import main

    repo = tmp_path / "repo"
    shutil.copytree(FIXTURE, repo)
    monkeypatch.setenv("KFBOT_CACHE", str(tmp_path / "cache"))
    code = main(["optimize", "softmax_kernel", "--repo", str(repo), "--executor", "ray",
                 "--no-llm", "--budget", "2"])
    err = capsys.readouterr().err
    assert code == EXIT_MISSING_TOOL, err
    assert "on the Ray actor: no CUDA GPU" in err


def cluster_nodes() -> list[dict[str, Any]]:
    return list(ray_module().nodes())


def test_results_in_input_order_from_both_gpus(cluster: Any, task: KernelTask,
                                               tmp_path: Path) -> None:
    run = executor(task, tmp_path, chunk=1)
    try:
        assert len(run.actors) == 2  # one per GPU in the cluster
        batch = blocks(512, 32, 256, 96, 1024, 64, 128, 160, **{"SLEEP": "0.2"})
        results = run.evaluate(batch)
        places = run.where()
    finally:
        run.close()
    source = (FIXTURE / KERNEL).read_bytes()
    assert [c for c, _ in results] == batch
    assert all(same(ev, expected(c, source)) for c, ev in results)
    assert len({ev.environment["pid"] for _, ev in results}) == 2
    assert len({p["node"] for p in places}) == 2


def test_two_chunks_in_flight_per_actor_take_the_gpu_in_turn(cluster: Any, task: KernelTask,
                                                             tmp_path: Path) -> None:
    run = executor(task, tmp_path, chunk=1, actors=1)
    try:
        results = run.evaluate(blocks(64, 128, 192, 256, SLEEP="0.3"))
        tokens = sorted(run._idle)
    finally:
        run.close()
    spans = sorted((ev.environment["started"], ev.environment["ended"]) for _, ev in results)
    assert all(end <= later for (_, end), (later, _) in itertools.pairwise(spans))
    assert tokens == [0, 0]  # both turns of the one actor are back after the batch


def test_crashed_actor_work_is_retried_on_a_fresh_actor(cluster: Any, task: KernelTask,
                                                         tmp_path: Path) -> None:
    marker = tmp_path / "crashed"
    batch = [*blocks(64, 128), *blocks(192, CRASH_ONCE=str(marker)), *blocks(256)]
    run = executor(task, tmp_path, chunk=1)
    try:
        results = run.evaluate(batch)
    finally:
        run.close()
    assert marker.exists()  # the crash really happened, mid-evaluation
    source = (FIXTURE / KERNEL).read_bytes()
    assert [c for c, _ in results] == batch
    assert all(same(ev, expected(c, source)) for c, ev in results)


def test_gives_up_after_max_tries_with_a_runtime_failure(cluster: Any, task: KernelTask,
                                                         tmp_path: Path) -> None:
    batch = [*blocks(64), *blocks(96, CRASH="always"), *blocks(128)]
    run = executor(task, tmp_path, chunk=1, max_tries=2)
    try:
        results = run.evaluate(batch)
    finally:
        run.close()
    doomed = results[1][1]
    assert (doomed.stage, doomed.ok) == ("runtime", False)
    assert "lost 2 times" in doomed.reason
    assert [ev.ok for _, ev in results] == [True, False, True]


def test_a_node_lost_mid_run_costs_only_its_in_flight_work(cluster: Any, task: KernelTask,
                                                           tmp_path: Path) -> None:
    doomed = cluster.add_node(num_cpus=2, num_gpus=1)
    cluster.wait_for_nodes()
    run = executor(task, tmp_path, chunk=1)
    try:
        places = run.where()
        assert len(places) == 3 and doomed.node_id in {p["node"] for p in places}
        batch = blocks(*range(32, 32 * 13, 32), SLEEP="0.5")
        out: list[list[tuple[Candidate, Evaluation]]] = []
        worker = threading.Thread(target=lambda: out.append(run.evaluate(batch)))
        worker.start()
        time.sleep(1.0)  # every actor is inside its second evaluation
        cluster.remove_node(doomed)
        worker.join(timeout=60)
        survivors = run.where()  # the replacement waits for a GPU, so gets no work
    finally:
        run.close()
    source = (FIXTURE / KERNEL).read_bytes()
    assert out and [c for c, _ in out[0]] == batch
    assert all(same(ev, expected(c, source)) for c, ev in out[0])
    assert doomed.node_id not in {p["node"] for p in survivors} and len(survivors) == 2


def test_source_is_unpacked_where_the_task_root_is_missing(tmp_path: Path) -> None:
    bundle = pack_source(FIXTURE)
    assert place_source(bundle, FIXTURE) == FIXTURE  # same files here: used in place
    elsewhere = place_source(bundle, tmp_path / "not-on-this-node")
    assert elsewhere != FIXTURE
    assert (elsewhere / KERNEL).read_bytes() == (FIXTURE / KERNEL).read_bytes()
    assert sorted(bundle.manifest) == sorted(
        p.relative_to(elsewhere).as_posix() for p in elsewhere.rglob("*") if p.is_file())


def test_source_over_the_limit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KfbotError, match="over the 0 MiB limit"):
        pack_source(FIXTURE, limit=1000)


def test_without_ray_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                      task: KernelTask, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(KfbotError, match=r"pip install 'kfbot\[ray\]'") as caught:
        ray_module()
    assert caught.value.exit_code == 3
    with pytest.raises(KfbotError, match=r"needs Ray: pip install 'kfbot\[ray\]'"):
        executor(task, tmp_path)
