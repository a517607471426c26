"""The real engines: ``torch.distributed`` process groups on CPU, and what runs in them.

``launcher`` starts the ranks (``distopt.launch``), forked from ``fork_server``; every
function it runs lives here or in a notebook cell: ``examples`` (tiny workers for tests),
``ddp`` (DistributedDataParallel and all_reduce timing), ``sharding``
(ZeroRedundancyOptimizer and FSDP2), ``model_parallel`` (DTensor tensor parallelism and
``torch.distributed.pipelining``; Megatron's f/g and a GPipe stage by hand),
``model_parallel_checks`` (section 03's rank code run on its shards), ``local_sgd_ranks``
(local SGD and DiLoCo), ``gossip_ranks`` (decentralized SGD on a ring by point-to-point
messages), ``federated_ranks`` (FedAvg on a server rank and client ranks, with and without
masked updates), ``sharded_norms`` (LAMB's per-layer norms and global-norm clipping on
sharded parameters, by an all-reduce of squared norms), ``gpt_ddp`` (the training project's
GPT, communication timed apart).
"""
