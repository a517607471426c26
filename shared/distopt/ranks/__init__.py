"""What the ranks of each section run, and the checks of a student's rank code.

Kind: rank code and its checks, by topic. Rule: ``<topic>_ranks.py`` holds a topic's rank code
(worker functions for ``distopt.launch`` and the benches that hand each rank its own data) and
``<topic>_checks.py`` the checks of a student's rank code on that topic (``run_<topic>`` starts
it, ``assert_<property>`` compares it with one process, counts and inspects its messages, and
says what differed). A bench answers only for the rank that holds it, and the reference answers
of graded exercises stay with the grader (``autograder/references``). The machinery that starts
and watches ranks is :mod:`distopt.engine`.
"""
