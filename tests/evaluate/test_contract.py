"""The original defines the contract: the inputs kfbot adds, tried on the original
first, their bookkeeping, and the findings about the original they become.

The end-to-end test runs the contract job in a real worker process against a CPU
stand-in of an op (tests/data/contract_repo): wrong on rows that are not a multiple of
32 wide, raising on narrow rows, a sticky CUDA error on one row, a crash on 63 rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kfbot.evaluate.capture.signature import CallSignature, TensorSpec, contiguous_strides
from kfbot.evaluate.capture.via import Via
from kfbot.evaluate.inputs.contract import (
    FINDING,
    Contract,
    Trial,
    Verdict,
    admitted,
    estimated_bytes,
    judged,
    size_trials,
    standard_trials,
)
from kfbot.evaluate.worker.session import JobResult, WorkerSession

REPO = Path(__file__).resolve().parents[1] / "data" / "contract_repo"
KFBOT_PARENT = str(Path(__file__).resolve().parents[2])
JOB = "kfbot.evaluate.device.contract:try_on_original"


def sig(*shape: int, device: str = "cpu", tests: tuple[str, ...] = ()) -> CallSignature:
    spec = TensorSpec(shape=shape, dtype="float32", strides=contiguous_strides(shape),
                      contiguous=True, device=device, min=-1.0, max=1.0)
    return CallSignature(op="contract_ops.double32", args=(spec,), tests=tests)


def test_standard_trials_keep_the_call_they_vary() -> None:
    via = Via("pkg:double", (0,), (), ())
    source = CallSignature(op="x.double32", args=sig(64, 96).args, tests=("t.py::test_a",),
                           via=via)
    trials = standard_trials([source], block=32)
    labels = [t.label for t in trials]
    assert labels[:6] == ["edge (64, 1) float32", "edge (1, 96) float32",
                          "edge (64, 33) float32", "edge (33, 96) float32",
                          "edge (64, 95) float32", "edge (63, 96) float32"]
    assert {"x2 (128, 96) float32", "x4 (256, 96) float32"} <= set(labels)
    assert labels[-1].startswith("large (") and [t.kind for t in trials][-1] == "large"
    # A reference written over the wrapper's arguments still applies to the variants.
    assert all(t.signature.tests == ("t.py::test_a",) and t.signature.via == via
               for t in trials)
    assert [t.label for t in size_trials([source], [4096])] == [
        "compared size (4096, 4096) float32", "compared size (4096, 96) float32",
        "compared size (64, 4096) float32"]


def test_the_bytes_a_trial_needs_are_known_before_it_runs() -> None:
    # 1 MiB of float32 input: inputs and their copy, an output, its float64 reference
    # copies of the input and of the output.
    assert estimated_bytes(sig(256, 1024)) == (2 + 1 + 2 + 2) * (1 << 20)


def test_a_trial_round_trips_and_each_exclusion_says_what_it_means() -> None:
    trial = standard_trials([sig(8, 32)], block=None)[0]
    assert Trial.from_json(trial.to_json()) == trial
    for exclusion, words in [("wrong", "the original is wrong at"),
                             ("raises", "the original raises at"),
                             ("cuda-error", "the original hits a CUDA error at"),
                             ("crash", "the original takes its process down at"),
                             ("hangs", "the original does not finish at"),
                             ("memory", "{} was not tried"),
                             ("untried", "{} could not be tried on the original")]:
        verdict = Verdict(trial, exclusion, "why")  # type: ignore[arg-type]
        assert Verdict.from_json(verdict.to_json()) == verdict
        finding = verdict.finding()
        assert finding is not None and finding.check == FINDING and finding.severity == "warn"
        said = words.format(trial.label) if "{}" in words else f"{words} {trial.label}"
        assert finding.reason == f"{said}: why"
    assert Verdict(trial, "narrow").finding() is None  # the original is right there
    assert Verdict(trial).finding() is None and Verdict(trial).admitted
    with pytest.raises(ValueError, match="unknown exclusion"):
        Verdict.from_json({**Verdict(trial).to_json(), "exclusion": "bogus"})


def result(status: str, kind: str, tail: str, value: dict[str, object] | None = None
           ) -> JobResult:
    return JobResult(status, value, kind, f"{status} {kind}", tail)  # type: ignore[arg-type]


def test_each_way_a_job_ends_is_booked() -> None:
    todo = standard_trials([sig(64, 96)], block=32)[:4]
    first = Verdict(todo[0], "raises", "no").to_json()
    ok = result("ok", "ok", "", {"verdicts": [first]})
    assert judged(todo, ok) == ([Verdict(todo[0], "raises", "no")], todo[1:])
    tail = "kfbot contract: trying 0\nkfbot contract: trying 2\nSegmentation fault\n"
    verdicts, rest = judged(todo, result("crashed", "segfault", tail))
    assert [(v.trial, v.exclusion) for v in verdicts] == [(todo[2], "crash")]
    assert rest == [todo[0], todo[1], todo[3]]  # tried again in a fresh worker
    assert judged(todo, result("crashed", "illegal_address", tail))[0][0].exclusion == \
        "cuda-error"
    assert judged(todo, result("timeout", "timeout", tail))[0][0].exclusion == "hangs"
    assert judged(todo, result("error", "exception", tail))[0][0].exclusion == "raises"
    untried, rest = judged(todo, result("error", "exception", "ImportError: no op\n"))
    assert [v.exclusion for v in untried] == ["untried"] * 4 and rest == []


@pytest.fixture(scope="module")
def session() -> WorkerSession:
    with WorkerSession(cwd=REPO, python_path=[KFBOT_PARENT, str(REPO)],
                       preload=("torch",)) as live:
        yield live


def test_the_original_narrows_the_contract(session: WorkerSession) -> None:
    # The large shape is left to the GPU tests: on a CPU it only costs time.
    trials = [*(t for t in standard_trials([sig(64, 96)], block=32) if t.kind != "large"),
              Trial("large", "huge (1099511627776,) float32", sig(1 << 40))]
    payload = {"op": {"kind": "module", "module": "contract_ops", "name": "double32"},
               "original": {"artifact": str(REPO / "contract_ops.py"),
                            "module_name": "contract_ops"},
               "references": [{"callable_ref": "contract_ops:reference"}],
               "tolerances": {}, "seed": 7, "device": "cpu", "sys_path": [str(REPO)]}
    jobs = []

    def run(todo: list[Trial]) -> JobResult:
        jobs.append([t.label for t in todo])
        return session.call(JOB, {**payload, "trials": [t.to_json() for t in todo]},
                            timeout_s=120)

    contract = admitted(Contract(), trials, run)
    by_label = {v.trial.label: v for v in contract.verdicts}
    exclusions = {label: v.exclusion for label, v in by_label.items()}
    assert exclusions == {
        "edge (64, 1) float32": "raises",  # narrower than a chunk: no grid to launch
        "edge (1, 96) float32": "cuda-error",  # caught in the job: a fresh worker follows
        "edge (64, 33) float32": "wrong",  # the tail of each row is never doubled
        "edge (33, 96) float32": None,
        "edge (64, 95) float32": "wrong",
        "edge (63, 96) float32": "crash",  # the worker died there; the rest went on
        "x2 (128, 96) float32": None,
        "x4 (256, 96) float32": None,
        "huge (1099511627776,) float32": "memory",  # never allocated
    }
    # A second job after the sticky error (the job ended there and asked for a fresh
    # worker), a third after the crash: the three judged before it are tried again.
    assert [len(j) for j in jobs] == [9, 7, 6]
    wrong = by_label["edge (64, 33) float32"].finding()
    assert wrong is not None and wrong.reason.startswith(
        "the original is wrong at edge (64, 33) float32: reference's: ")
    assert "SIGSEGV" in by_label["edge (63, 96) float32"].detail
    assert "invalid configuration" in by_label["edge (64, 1) float32"].detail
    assert contract.admitted == tuple(t for t in trials if exclusions[t.label] is None)
    assert contract.summary() == ("3 of 9 added inputs hold on the original; left out: 2 "
                                  "wrong, 1 raises, 1 a CUDA error, 1 a crash, 1 too large "
                                  "for the free memory")
    # Asked again, nothing runs: each trial is tried once.
    assert admitted(contract, trials, run) == contract and len(jobs) == 3


# --- compared as the repository's test compares ------------------------------------------


def test_an_output_the_tests_comparison_accepts_passes_with_a_warning() -> None:
    torch = pytest.importorskip("torch")
    from kfbot.evaluate.device.lenient import leniency_of
    from kfbot.evaluate.device.verify import Context, InputSet, Run, judge
    from kfbot.evaluate.inputs.contract import lenient_findings

    inputs = InputSet("(4,) float32 seed#0", [torch.ones(4)], {})
    got, want = torch.tensor([2.5]), torch.tensor(2.5, dtype=torch.float64)
    strict = judge(Run(got), want, inputs, "reference", Context({}, None))
    assert not strict["passed"]  # kfbot alone: shape (1,) is not ()
    allclose = Context({}, None, lenient=leniency_of("torch.allclose"))
    record = judge(Run(got), want, inputs, "reference", allclose)
    assert record["passed"] and record["lenient"] == (
        "shape (1,) against the reference's (), which the repository's torch.allclose accepts")
    # Against the original, the op's own shape is the contract: no leniency there.
    assert not judge(Run(got), want, inputs, "original", allclose)["passed"]
    assert leniency_of("torch.testing.assert_close") is None  # as strict as kfbot
    wrong = judge(Run(torch.tensor([9.0])), want, inputs, "reference", allclose)
    assert not wrong["passed"] and "lenient" not in wrong  # accepted shapes, wrong values
    finding, = lenient_findings([record, strict, record])
    assert (finding.check, finding.severity) == ("as-the-test-compares", "warn")
    assert finding.reason == ("kfbot's own comparison is stricter than the test's: shape (1,) "
                              "against the reference's (), which the repository's "
                              "torch.allclose accepts")


def test_numpy_comparisons_promote_dtypes() -> None:
    torch = pytest.importorskip("torch")
    from kfbot.evaluate.device.lenient import leniency_of, relaxed

    got = [torch.ones(3, dtype=torch.float32)]
    want = torch.ones(3, dtype=torch.float16)
    out, note = relaxed(got, want, leniency_of("numpy.allclose"))
    assert out[0].dtype == torch.float32 and note.startswith("dtype float32 against the "
                                                               "reference's float16")
    assert relaxed(got, want, leniency_of("torch.allclose")) == (want, "")  # no promotion
    # Not the same elements in the same order: broadcasting would compare other values.
    assert relaxed([torch.ones(2, 3)], torch.ones(3), leniency_of("torch.allclose"))[1] == ""
