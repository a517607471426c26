"""Simulations of distributed algorithms in numpy: many "devices" in one process.

``collectives`` (ring and parameter-server all-reduce, bytes counted), ``overlap`` (the
backward/all-reduce timeline of DDP buckets), ``sgd_steps`` (steps to a loss by batch size),
``tensor_parallel``, ``pipeline`` (schedules and Gantt charts), ``experts``,
``sequence_parallel`` (ring attention), ``stragglers``, ``async_sgd``, ``gossip``,
``local_sgd`` (local SGD, DiLoCo), ``federated`` (FedAvg, FedProx, SCAFFOLD, masks, DP).
Each is checked against a single-process baseline or its closed form in ``distopt.costs``.
"""
