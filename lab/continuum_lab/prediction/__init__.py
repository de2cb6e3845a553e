"""`vllm-continuum predict RUN_DIR --cost-model FILE`: the simulator set beside a
live `compare` run, round by round and flavour by flavour (docs/calibration.md).

    settings.py   which simulated scheduler, with which settings, a live server was
    overhead.py   the API server's per-request time, which the simulator lacks
    tables.py     predicted beside measured, the errors, and why they differ
    turns.py      every turn measured beside predicted (turns.csv)
    command.py    the command: load the rounds, simulate each, report
    cli.py        its arguments
"""
