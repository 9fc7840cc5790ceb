"""The GPU worker: an isolated, restartable subprocess that runs jobs by name.

    session   kfbot's side: start the worker, send it jobs, read their results
    main      the child: `python -m kfbot.evaluate.worker.main --requests FD --results FD`

The jobs themselves (`kfbot.evaluate.device`) are the only code that meets torch and
a candidate; this package imports neither.
"""
