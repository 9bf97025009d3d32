"""The performance model: iteration time predicted from a network's work and a machine's measurements.

Framework-free and process-free: it reads definitions and the store, and runs nothing (running the
`kernels` suite is execution/kernels.py). `kernels` names the kernels a network is made of (and
that the `kernels` suite measures); `kernel_suite` reads a `kind: kernels` suite file into the
kernels each benchmark times; `workload` breaks a resolved network into forward, backward and
update work per layer; `communication` is the α–β cost of ring all-reduce with the wait-free
(WFBP) and merged-gradient (MG-WFBP) schedules; `model` puts them together with a machine profile
(store/profiles.py: measured ceilings, kernel times and all-reduce and all-to-all fits) into a per-phase
prediction; `calibration` makes a profile from measurements; `runtime` is the prediction each run
record keeps; `accuracy` compares stored predictions with what the runs measured.
"""
