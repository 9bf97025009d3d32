"""The performance model: iteration time predicted from a network's work and a machine's measurements.

Framework-free, like the rest of the controller. `kernels` names the kernels a network is made of
(and that the `kernels` suite measures); `workload` breaks a resolved network into forward,
backward and update work per layer; `communication` is the α–β cost of ring all-reduce with the
wait-free (WFBP) and merged-gradient (MG-WFBP) schedules; `profile` is a machine's measured
ceilings, kernel times and all-reduce fits, stored versioned in the store; `model` puts them
together into a per-phase prediction; `calibration` makes a profile from measurements; `accuracy`
compares stored predictions with what the runs measured.
"""
