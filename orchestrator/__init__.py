"""qkstudy orchestrator: a study spec in, compute-matched runs trained and reported.

The sub-packages are the stages of the data flow, each importing only earlier ones:

    plan/    spec -> Study -> [RunSpec]: validation, recipes, FLOP/token/wall-clock budgets.
             Pure: no Ray, no MLflow, no disk beyond the spec itself.
    run/     [RunSpec] -> trained runs: Ray placement and packing, data-preparation tasks,
             the Ray Train + DeepSpeed worker loop, calibration, cluster submission.
    track/   the MLflow conventions, written by run/ and read by report/: tag names,
             statuses, the default tracking URI, redaction.
    report/  MLflow -> curves, token ratios, fits, plots.

`cli.py` and `bench.py` are the front doors on top.
"""
