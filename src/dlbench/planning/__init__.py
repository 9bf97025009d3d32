"""The cluster planner (`dlbench plan`): which job goes where on a heterogeneous cluster, from
dlbench's own measurements and predictions.

    cluster.py     the cluster file: device types, nodes, links, prices (validated, pydantic)
    trace.py       the job trace: dlbench's own YAML/CSV form (validated, bounded)
    readers.py     Gavel's traces and throughput table, Slurm's `sacct --parsable2`
    matrix.py      the throughput matrix: measured, calibrated, datasheet or table, per cell
    policies.py    FIFO, SRTF, Tiresias LAS, Gavel's LPs (HiGHS), the framework-aware policy
    simulator.py   the event-driven simulation with rounds and preemption cost
    metrics.py     JCT, makespan, utilisation, cost, finish-time fairness

It reads the store and the performance model; the workflow (workflows/planning.py) gathers the
inputs, the report (reporting/plan_page.py) and the CLI (cli/plan.py) show what it returns.
"""
