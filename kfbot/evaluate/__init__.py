"""The evaluation of one candidate: built, checked, run against its reference and
timed, in an isolated worker; the answer is an `Evaluation`, never an exception.

    engine        the engine: build, capture inputs, verify and benchmark in the worker
    judge         the worker's answer read into an `Evaluation`
    evaluation    the answer for one candidate: how far it got, why, how fast
    candidate     a candidate: the edited files and parameter values, content-hashed
    task          what the engine knows about one kernel (`KernelTask`)
    scope         what a candidate may change; `sources` the C++/CUDA it is judged on
    neighbours    the other ops a change to shared code reaches, verified too
    finalist      the repository's own build and tests, against the finalist
    isolation     what a candidate can do to the judging of itself and of the next
    against_base  a changed kernel against its version at a base revision
    render        evaluations for people and machines
    poison        free GPU memory filled with a pattern (the worker's probes, the observer)

    build/      the extension, compiled the repository's way, object by object
    capture/    the repository's tests and scripts run; the op's calls and, when
                observing, each test's kernel launches recorded
    inputs/     inputs beyond the captured calls, and the contract they make
    reference/  the test's reference, made callable
    verdict/    correctness, tolerances, timing statistics, the speed of light
    baseline/   the original's steps, each with what would fix it
    worker/     the isolated worker process; device/ the jobs it runs (torch)
    sandbox/    where untrusted code runs; observe/ what tests launch on the GPU
    reproduce/  a run's speedup measured again from its patch alone

It may import `kfbot.anticheat`, `kfbot.scan` and the ground floor; torch only inside
the worker (`device/`) and in the repository's processes. The sub-packages import one
way, lowest first: sandbox, verdict, worker, capture, build, baseline, inputs,
reference, device, observe, reproduce (docs/architecture.md).
"""
