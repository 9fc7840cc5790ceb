"""The capture: the repository's own tests and scripts run in sandboxed processes, and
what they do recorded: how they call the op (`kfbot.evaluate.capture.signature`) and,
when observation is asked for, which kernels each test launches (`launches`).

kfbot's side, which runs and reads:

    collect      run the tests and scripts under the recorder; the signatures they made
    suite        a test suite split into one process per file; twins recognised
    reach        which captured calls reach the kernel under optimization

Inside the repository's processes, where nothing of the engine is imported:

    harness      the first code of every such process
    plugin       the pytest plugin that switches the recorder on
    recorder     the op wrapped; each call described and kept
    imports      kfbot's hooks on the process's imports: its builds under their real
                 names (staged), and the watched modules heard as they load
    describe     one argument of a call, as a record
    via          how an op call sat inside the wrapper the test called
    launch_recorder  the kernels each test launches, through which op, with freed
                 memory poisoned (`kfbot.evaluate.poison`) when a mutant is tried

Records shared by both sides: `signature` (arguments, calls, op references, merged
signatures), `protocol` (the request kfbot sends, the file the recorder writes),
`launches` (the observation request and each test's launches) and `fields` (their
JSON read strictly). It may import `kfbot.evaluate.sandbox`, the build records and
`kfbot.evaluate.poison`; the observer that drives an observation
(`kfbot.evaluate.observe`) sits above it. Nothing here imports torch at module level.
"""
