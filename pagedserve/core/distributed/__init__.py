"""Tensor parallelism over torch.distributed: the process group and its collectives (group.py),
the step plan sent to the workers (step.py), the worker processes (worker.py) and their
launcher and watchdog on the engine's side (launcher.py)."""
