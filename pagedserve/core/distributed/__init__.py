"""The bottom of tensor parallelism, under the models: the process group and its collectives
(group.py) and the step inputs rank 0 sends every worker (step.py, which a single process builds
its inputs with too). The worker processes and their launcher sit above the models, in
core/executor/."""
