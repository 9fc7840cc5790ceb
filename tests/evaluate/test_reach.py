"""Keeping the captured calls that launch the kernel under optimization: an op that
picks its kernel by its arguments must not be timed on calls that run another kernel.

The kernel listing itself comes from the GPU worker's profiler
(tests/evaluate/test_verify_layouts_gpu.py runs it); here, what is kept and what is said."""

from __future__ import annotations

from kfbot.evaluate.capture.reach import split_by_launch
from kfbot.evaluate.capture.signature import CallSignature, ScalarSpec, TensorSpec


def sig(n: int) -> CallSignature:
    x = TensorSpec((n,), "float32", (1,), True, "cuda")
    return CallSignature("torch.ops.kfops.scale", (x, ScalarSpec("float", 2.5)))


def test_calls_that_launch_another_kernel_are_dropped_and_counted() -> None:
    sigs = [sig(1 << 20), sig(7), sig(4096), sig(1)]
    launched = [["scale_vec4_kernel"], ["scale_naive_kernel"], ["scale_vec4_kernel"],
                ["scale_naive_kernel"]]
    reach = split_by_launch(sigs, launched, "scale_naive_kernel")
    assert reach.kept == (sigs[1], sigs[3]) and reach.dropped == 2
    assert reach.summary("scale_naive_kernel") == (
        "kept 2 that launch scale_naive_kernel; dropped 2 that launch scale_vec4_kernel "
        "instead (the op chooses its kernel by its arguments)")


def test_no_call_reaching_the_kernel_is_said_plainly() -> None:
    reach = split_by_launch([sig(7)], [["rowmax_warp_kernel", "fill_kernel"]],
                            "rowmax_naive_kernel")
    assert reach.none and not reach.kept
    assert reach.summary("rowmax_naive_kernel") == (
        "none of the captured calls launches rowmax_naive_kernel: they launch "
        "fill_kernel, rowmax_warp_kernel")


def test_a_profiler_that_saw_nothing_drops_nothing() -> None:
    sigs = [sig(7), sig(9)]
    reach = split_by_launch(sigs, [[], []], "scale_naive_kernel")
    assert reach.kept == tuple(sigs) and not reach.none
    assert reach.summary("scale_naive_kernel").startswith("the profiler saw no kernel")
