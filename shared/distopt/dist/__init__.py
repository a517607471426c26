"""The real engines: ``torch.distributed`` process groups on CPU, and what runs in them.

``launcher`` starts the ranks (``distopt.launch``); every function it runs lives here or in
a notebook cell: ``examples`` (tiny workers for tests), ``ddp`` (DistributedDataParallel and
all_reduce timing), ``sharding`` (ZeroRedundancyOptimizer and FSDP2), ``model_parallel``
(DTensor tensor parallelism and ``torch.distributed.pipelining``), ``local_sgd_ranks``
(local SGD and DiLoCo), ``gpt_ddp`` (the training project's GPT, communication timed apart).
"""
