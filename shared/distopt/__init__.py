"""distopt: the helper package of the course "Distributed optimization of large models".

The course's method is closed-form model -> numpy simulation -> measured run on the real
engine, and the package is grouped the same way:

* ``distopt.costs``: closed-form cost models (communication, memory, FLOPs, the pipeline
  bubble, the critical batch size, the 3D-parallelism planner);
* ``distopt.sim``: numpy simulations of the distributed algorithms (collectives, DDP's
  overlap, tensor and pipeline parallelism, experts, ring attention, stragglers,
  asynchronous SGD, gossip, local SGD and DiLoCo, federated learning);
* ``distopt.engine``: the real engine's machinery, ``torch.distributed`` on CPU processes:
  the launcher (``distopt.launch``; ``distopt.launch_map`` for independent runs on every
  core), its fork server, and the recorder of messages;
* ``distopt.ranks``: every function the launcher runs that is not defined in a notebook,
  ``<topic>_ranks`` (rank code, benches) and ``<topic>_checks`` (checks of a student's);
* ``distopt.problems``: seeded toy data and tiny models (logistic regression, least
  squares, a classification task, the MLP, a Markov language);
* ``distopt.optim``: schedules, LARS and LAMB, the AdamW recipe, the spike monitor;
* ``distopt.explore``: interactive explorers over the cost models (02, 03, 06);
* ``distopt.project``: section 07's GPT, its training loop, checkpoints, the ``torchrun``
  entry point, hyperparameter search and diagnosis;
* for the notebooks' cells: ``grading`` (tests that a student did not call the package),
  ``likely_bugs`` (under a failed test's traceback, the catalogued mistake it looks like),
  ``claims`` (bands for numbers whose digits depend on the CPU), ``machine`` (what this
  CPU can do) and ``units``.
"""

from distopt.engine.launcher import LaunchError, LaunchTimeout, launch, launch_map

__all__ = ["LaunchError", "LaunchTimeout", "launch", "launch_map"]


def _note_likely_bugs() -> None:
    """In a notebook's kernel, name the likely bug under a failed test (distopt.likely_bugs)."""
    import sys

    if "IPython" in sys.modules:
        from distopt import likely_bugs

        likely_bugs.install()


_note_likely_bugs()
