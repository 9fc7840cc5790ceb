"""The GitHub Action's orchestration: what `kfbot action` does with the runner's event.

    run          the run flow: the event and the inputs pick a mode; every run ends with
                 annotations, the job summary, the outputs and the report
    context      the runner's environment: inputs, checkout, token, client, status comment
    scan         scan mode: the kernel table, its problems annotated
    comment      comment mode: a `/kfbot` command on a pull request, answered
    guard        guard mode: a pull request's changed kernels against its base branch
    optimize     optimize mode: each kernel searched, a winner published or handed over
    gpu          what the GPU modes share: the GPU check, a kernel's task and engine
    publish_job  the publish job of the two-job workflow: the handed-over run published

It may import every floor below `github` and the rest of `kfbot.github`; the command
`kfbot.commands.action` is a thin entry point above it.
"""
