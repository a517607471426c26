"""The real engine's machinery: ``torch.distributed`` process groups on CPU processes.

``launcher`` starts the ranks (``distopt.launch``), forked from ``fork_server``, whose one
import of torch is ``preload``; ``shipping`` sends a notebook-defined function by value with
its cells' lines; ``rank`` is what runs in each rank process (a session of its own, log
redirection, joining the group, the report); ``diagnosis`` words a failed launch (a few KB
of a rank's log and error, where each rank of a hung launch waits); ``record`` logs a rank's
collectives and point-to-point calls (bytes, op, peer, time, and with ``payloads=True`` what
they carried); ``link`` gives a rank's collectives the timing of a stated network (the
alpha-beta model, time-scaled, sleeping instead of computing); ``examples`` holds tiny
workers for the launcher's own tests. What the ranks of each section run, and the checks of
a student's rank code, live in :mod:`distopt.ranks`.
"""
