"""Redrawn inputs on CPU tensors: each distribution's statistics, what is kept of the
captured call (layouts, integer and boolean values, the sign of a non-negative
input), and the seed schedule's phases."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kfbot.evaluate.capture.signature import CallSignature, ScalarSpec, TensorSpec  # noqa: E402
from kfbot.evaluate.inputs.contract import shape_label  # noqa: E402
from kfbot.evaluate.inputs.distributions import (  # noqa: E402
    DISTRIBUTIONS,
    PHASES,
    SPIKE_EXPONENTS,
    SeedSchedule,
    draw_args,
    draw_parameters,
    sample,
)
from kfbot.evaluate.inputs.fresh import make_args  # noqa: E402
from kfbot.evaluate.inputs.redrawn import distribution_trials  # noqa: E402

N = 1 << 18


def _tensor(shape: tuple[int, ...], dtype: str = "float32", lo: float | None = None,
            hi: float | None = None, strides: tuple[int, ...] | None = None,
            offset: int = 0) -> TensorSpec:
    dense = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    strides = dense if strides is None else strides
    return TensorSpec(shape, dtype, strides, strides == dense, "cpu", lo, hi,
                      storage_offset=offset)


def _draw(name: str, seed: int = 7, shape: tuple[int, ...] = (N,)) -> torch.Tensor:
    params = draw_parameters(name, seed)
    gen = torch.Generator().manual_seed(seed)
    return sample(params, shape, torch.float32, torch.device("cpu"), gen)


def test_normal_and_uniform_have_their_drawn_location_and_scale() -> None:
    for seed in range(5):
        p = draw_parameters("normal", seed)
        x = _draw("normal", seed).double()
        assert abs(float(x.mean()) - p.location * p.scale) < 0.02 * p.scale
        assert abs(float(x.std()) / p.scale - 1) < 0.02
        u = _draw("uniform", seed).double()
        q = draw_parameters("uniform", seed)
        lo = q.location * q.scale - q.width * q.scale
        hi = q.location * q.scale + q.width * q.scale
        assert lo - 1e-4 <= float(u.min()) < lo + 0.01 * (hi - lo)
        assert hi - 0.01 * (hi - lo) < float(u.max()) <= hi + 1e-4
        # flat: each tenth of the interval holds about a tenth of the values
        counts = torch.histc(u, bins=10, min=lo, max=hi) / u.numel()
        assert float((counts - 0.1).abs().max()) < 0.01


def test_locations_and_scales_differ_between_draws() -> None:
    drawn = {(draw_parameters("normal", s).location, draw_parameters("normal", s).scale)
             for s in range(20)}
    assert len(drawn) == 20
    scales = [draw_parameters("normal", s).scale for s in range(200)]
    assert min(scales) < 0.5 and max(scales) > 2.0  # 2**-2..2**2


def test_pareto_has_a_heavy_tail_of_index_one_and_a_half() -> None:
    x = _draw("pareto").double().abs()
    p = draw_parameters("pareto", 7)
    # Hill's estimator of the tail index on the largest 1%: alpha = 1.5 +- sampling.
    top = x.sort(descending=True).values[: N // 100] / p.scale + 1.0
    hill = 1.0 / float((top / top[-1]).log().mean())
    assert 1.3 < hill < 1.7
    assert float(x.max()) > 1000 * float(x.median())
    signs = torch.sign(_draw("pareto"))
    assert abs(float(signs.mean())) < 0.02  # both signs, evenly


def test_wide_values_spread_evenly_over_the_exponents() -> None:
    x = _draw("wide").double()
    e = x.abs().log2()
    assert -20.01 < float(e.min()) < -19.9 and 19.9 < float(e.max()) < 20.01
    counts = torch.histc(e, bins=8, min=-20, max=20) / e.numel()
    assert float((counts - 1 / 8).abs().max()) < 0.01
    rows = _draw("wide", shape=(64, 1024)).abs()
    span = rows.amax(dim=1) / rows.amin(dim=1)
    assert float(span.min()) > 2.0**30  # every row spans most of the range


def test_spikes_hit_every_row_and_are_rare() -> None:
    p = draw_parameters("spikes", 3)
    x = _draw("spikes", 3, shape=(512, 1000)).abs()
    big = x > 2.0 ** SPIKE_EXPONENTS[0] * p.scale * 0.99
    assert bool(big.any(dim=1).all())
    assert 1 / 1000 < float(big.double().mean()) < 4 / 256
    assert float(x.max()) <= 2.0 ** SPIKE_EXPONENTS[1] * p.scale * 1.001


def test_half_precision_draws_stay_finite() -> None:
    for name in DISTRIBUTIONS:
        params = draw_parameters(name, 11)
        x = sample(params, (N,), torch.float16, torch.device("cpu"), torch.Generator())
        assert x.dtype == torch.float16 and bool(x.isfinite().all()), name


def test_integers_bools_scalars_and_layouts_are_kept() -> None:
    index = _tensor((300,), "int64", 0.0, 9.0)
    mask = _tensor((300,), "bool")
    view = _tensor((8, 16), strides=(1, 10), offset=3)  # a transposed slice of a buffer
    sig = CallSignature("m.op", (view, index, mask, ScalarSpec("float", 1e-5)),
                        (("bias", _tensor((16,))),))
    plain, plain_kw = make_args(sig, 5, "cpu")
    for name in DISTRIBUTIONS:
        args, kwargs = draw_args(sig, 5, "cpu", name)
        assert torch.equal(args[1], plain[1]) and torch.equal(args[2], plain[2])
        assert args[3] == 1e-5
        x = args[0]
        assert (x.shape, x.stride(), x.storage_offset()) == ((8, 16), (1, 10), 3)
        assert not torch.equal(x, plain[0])
        assert kwargs["bias"].shape == (16,) and not torch.equal(kwargs["bias"],
                                                                  plain_kw["bias"])


def test_a_non_negative_input_stays_non_negative() -> None:
    sig = CallSignature("m.op", (_tensor((4096,), lo=0.0, hi=3.0),
                                 _tensor((4096,), lo=-2.0, hi=0.0)), ())
    for name in DISTRIBUTIONS:
        (pos, neg), _ = draw_args(sig, 1, "cpu", name)
        assert float(pos.min()) >= 0 and float(neg.max()) <= 0, name


def test_draws_repeat_for_a_seed_and_change_with_it() -> None:
    sig = CallSignature("m.op", (_tensor((1000,)),), ())
    for name in DISTRIBUTIONS:
        a, _ = draw_args(sig, 42, "cpu", name)
        b, _ = draw_args(sig, 42, "cpu", name)
        c, _ = draw_args(sig, 43, "cpu", name)
        assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


def test_unknown_distribution_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown distribution"):
        draw_parameters("cauchy", 1)


def test_the_schedule_gives_each_phase_its_own_seeds() -> None:
    s = SeedSchedule(123456789)
    seeds = {(phase, i): s.seed(phase, i) for phase in PHASES for i in range(50)}
    assert len(set(seeds.values())) == len(seeds)  # no seed shared by two sets
    assert all(0 <= v < 2**48 for v in seeds.values())
    assert SeedSchedule(123456789).seed("timed", 3) == s.seed("timed", 3)
    assert SeedSchedule(123456790).seed("timed", 3) != s.seed("timed", 3)


def test_the_schedule_uses_every_distribution_in_an_order_of_its_own() -> None:
    s = SeedSchedule(99)
    for phase in PHASES:
        assert sorted(s.distributions(phase)) == sorted(DISTRIBUTIONS)
    eight = s.distributions("correctness", 8)
    assert sorted(eight[:5]) == sorted(DISTRIBUTIONS) and eight[5:] == eight[:3]
    orders = {SeedSchedule(root).distributions("correctness") for root in range(40)}
    assert len(orders) > 20  # the order is the run's, not kfbot's
    by_phase = {phase: SeedSchedule(7).distributions(phase) for phase in PHASES}
    assert len(set(by_phase.values())) > 1


# --- the redrawn inputs as trials of the contract -------------------------------------

REPO = Path(__file__).resolve().parents[1] / "data" / "softmax_repo"
KFBOT_PARENT = str(Path(__file__).resolve().parents[2])


def test_each_distribution_is_a_trial_and_signatures_take_turns() -> None:
    sigs = [CallSignature("m.op", (_tensor((64, 8 + n)),), ()) for n in range(3)]
    trials = distribution_trials(sigs, root=5)
    assert sorted(t.values for t in trials) == sorted(DISTRIBUTIONS)
    assert [t.signature.args[0].shape for t in trials] == [(64, 8), (64, 9), (64, 10),
                                                           (64, 8), (64, 9)]
    assert all(t.label == f"{t.values} {shape_label(t.signature)}" for t in trials)
    many = [CallSignature("m.op", (_tensor((4, 2 + n)),), ()) for n in range(12)]
    assert len(distribution_trials(many, root=5)) == 8  # every signature, up to 8
    assert distribution_trials([], root=5) == []


def test_a_trial_draws_the_same_values_in_every_process() -> None:
    from kfbot.evaluate.device.values import values_for

    trial = distribution_trials([CallSignature("m.op", (_tensor((16, 32)),), ())], 1)[0]
    a, _ = values_for(trial, 99, "cpu")
    b, _ = values_for(trial, 99, "cpu")
    assert torch.equal(a[0], b[0])
    others = [values_for(t, 99, "cpu")[0][0] for t in distribution_trials(
        [CallSignature("m.op", (_tensor((16, 32)),), ())], 1)[1:]]
    assert not any(torch.equal(a[0], o) for o in others)


def test_where_the_original_overflows_the_input_leaves_the_contract() -> None:
    """An original softmax without the max subtraction is right on the normal and
    uniform draws and overflows on the heavy tail, the wide range and the spikes:
    those three leave the contract as findings about the original."""
    from kfbot.evaluate.inputs.contract import Contract, admitted
    from kfbot.evaluate.worker.session import WorkerSession

    spec = TensorSpec((64, 513), "float32", (513, 1), True, "cpu", -4.0, 4.0)
    trials = distribution_trials([CallSignature("softmax_ops.softmax_no_max", (spec,), ())],
                                 root=11)
    payload = {"op": {"kind": "module", "module": "softmax_ops", "name": "softmax_no_max"},
               "original": {"artifact": str(REPO / "softmax_ops.py"),
                            "module_name": "softmax_ops"},
               "references": [{"callable_ref": "softmax_ops:reference"}],
               "tolerances": {}, "seed": 7, "device": "cpu", "sys_path": [str(REPO)]}
    with WorkerSession(cwd=REPO, python_path=[KFBOT_PARENT, str(REPO)]) as session:
        contract = admitted(Contract(), trials, lambda todo: session.call(
            "kfbot.evaluate.device.contract:try_on_original",
            {**payload, "trials": [t.to_json() for t in todo]}, timeout_s=120))
    verdicts = {v.trial.values: v.exclusion for v in contract.verdicts}
    assert verdicts == {"normal": None, "uniform": None, "pareto": "wrong", "wide": "wrong",
                        "spikes": "wrong"}, contract.verdicts
    reasons = [f.reason for f in contract.findings()]
    assert len(reasons) == 3 and all(r.startswith("the original is wrong at ") for r in reasons)
