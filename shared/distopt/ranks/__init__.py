"""What the ranks of each section run, and the checks of a student's rank code.

One naming rule: ``<topic>_ranks.py`` holds a topic's rank code (worker functions for
``distopt.launch``, the benches that hand each rank its own data, the package's reference
answers) and ``<topic>_checks.py`` the checks of a student's rank code on that topic (run it,
compare with one process, count and inspect the messages, say what differed):

* ``data_parallel_checks``: sections 01 and 02 (naive, bucketed and accumulating data
  parallelism, ZeRO-1) on :class:`distopt.problems.shards.ShardedProblem`;
* ``ddp_ranks``: DistributedDataParallel training, all_reduce timed by size and rank count;
* ``sharding_ranks``: ZeroRedundancyOptimizer and FSDP2, per-rank state and traffic;
* ``fsdp_ranks`` and ``fsdp_checks``: ZeRO-3 by hand on a bench that hands a rank its own
  slices and counts the gathered buffers alive; FSDP2's collectives and gathered memory;
* ``model_parallel_ranks`` and ``model_parallel_checks``: DTensor tensor parallelism and
  ``torch.distributed.pipelining``; section 03's checks of Megatron's f/g and of a GPipe
  stage written by hand (their reference answers stay with the grader, ``autograder/
  references``, as do those of the expert and ring-attention exercises);
* ``pipeline_ranks``: 1F1B beside GPipe on emulated devices (a sleep per task), the
  activations autograd holds on each stage;
* ``expert_checks``: section 03's checks of an MoE layer's dispatch and combine by
  all-to-all (expert parallelism);
* ``context_checks``: section 03's checks of ring attention with keys and values passed
  around a ring of ranks (context parallelism);
* ``local_sgd_ranks``: local SGD, DiLoCo and DDP on real ranks, bytes all-reduced;
* ``async_ranks`` and ``async_checks``: asynchronous SGD on a parameter-server rank and
  worker ranks (lockstep in the simulator's order, or timed by sleeps), section 05's checks;
* ``gossip_ranks`` and ``gossip_checks``: decentralized SGD on a ring by point-to-point
  messages;
* ``federated_ranks`` and ``federated_checks``: FedAvg on a server rank and client ranks,
  with and without masked updates;
* ``sharded_norms_ranks``: LAMB's per-layer norms and global-norm clipping on shards;
* ``gpt_ddp_ranks``: the training project's GPT data-parallel: by hand (communication timed
  apart), DDP and FSDP2.

The machinery that starts and watches ranks is :mod:`distopt.engine`.
"""
