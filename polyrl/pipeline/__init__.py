"""The asynchronous training pipeline: rollout, reward and update as roles joined by queues.

    tickets ──> rollout role ──> (bounded queue) ──> reward role ──> (bounded queue) ──> trainer
       ^                                                                                   │
       └──────────────── one ticket per committed step: weights, version, domain shares ───┘

staleness.py says which weight version each step's rollout samples with (max_staleness K),
roles.py what each role does, stream.py how the roles run beside one another (threads in
this process; their work happens in engine worker processes, sandboxes and torch kernels,
which release the interpreter), and backend.py where the roles live: here, or as Ray
actors (ray_roles.py). The trainer itself is polyrl/train/loop.py.
"""
