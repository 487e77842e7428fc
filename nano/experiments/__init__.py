"""The nano-scale experiments' own scripts: the question files the runs used and the
pre-registered verdicts, printed from the logs shipped in assets/nano-runs/.

    python -m nano.experiments.make_questions OUT_DIR
    python -m nano.experiments.sweep_verdict RUN_DIR [RUN_DIR ...]
    python -m nano.experiments.main_verdict RUNS_ROOT [EVALS_ROOT]
    python -m nano.experiments.collapse RUNS_ROOT
"""
