"""What the ranks of each section run, and the checks of a student's rank code.

One naming rule: ``<topic>_ranks.py`` holds a topic's rank code (worker functions for
``distopt.launch``, the benches that hand each rank its own data, the package's reference
answers) and ``<topic>_checks.py`` the checks of a student's rank code on that topic (run it,
compare with one process, count and inspect the messages, say what differed):

* ``data_parallel_checks``: sections 01 and 02 (naive, bucketed and accumulating data
  parallelism, ZeRO-1) on :class:`distopt.problems.shards.ShardedProblem`;
* ``ddp_ranks``: DistributedDataParallel training, all_reduce timed by size and rank count;
* ``sharding_ranks``: ZeroRedundancyOptimizer and FSDP2, per-rank state and traffic;
* ``model_parallel_ranks`` and ``model_parallel_checks``: DTensor tensor parallelism and
  ``torch.distributed.pipelining``; Megatron's f/g and a GPipe stage by hand, and section
  03's checks of them;
* ``local_sgd_ranks``: local SGD, DiLoCo and DDP on real ranks, bytes all-reduced;
* ``gossip_ranks`` and ``gossip_checks``: decentralized SGD on a ring by point-to-point
  messages;
* ``federated_ranks`` and ``federated_checks``: FedAvg on a server rank and client ranks,
  with and without masked updates;
* ``sharded_norms_ranks``: LAMB's per-layer norms and global-norm clipping on shards;
* ``gpt_ddp_ranks``: the training project's GPT, communication timed apart.

The machinery that starts and watches ranks is :mod:`distopt.engine`.
"""
