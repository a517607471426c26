"""nbgrader configuration of the course.

nbgrader reads this file when it runs with autograder/ as its working directory (the
Makefile and autograder/worker.py do that); the course root is the repository.
"""

from pathlib import Path

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

ROOT = Path(__file__).resolve().parent.parent

c.CourseDirectory.root = str(ROOT)
c.CourseDirectory.source_directory = "solutions"  # reference notebooks, edited by authors
c.CourseDirectory.release_directory = "notebooks"  # student notebooks, made by `make release`
c.CourseDirectory.submitted_directory = "autograder/submitted"
c.CourseDirectory.autograded_directory = "autograder/autograded"
c.CourseDirectory.feedback_directory = "autograder/feedback"
# traces/: profiler traces a notebook writes beside itself when it runs (section 01's timeline),
# never part of a release
c.CourseDirectory.ignore = [
    ".ipynb_checkpoints",
    "*.pyc",
    "__pycache__",
    "traces",
    "*.messages.jsonl",  # the grader's message logs (autograder.similarity): not on feedback
    "*.test-times.jsonl",
]

# Each cell may take this long before it is interrupted and marked as failed; the slowest
# reference cell (real 4-process torch.distributed runs) takes about 10 s.
c.Execute.timeout = 120
# Restore test cells a student deleted, so that a deleted test scores 0 rather than vanishing.
c.OverwriteCells.add_missing_cells = True
# Nothing in the course needs more; a notebook printing megabytes is cut, not stored.
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100

# Grade what ran before a kernel death instead of leaving the submission blank; score 0 for
# tests run after the student's code patched what they rely on; cap each cell's output; run
# kernels in the sandbox when the grader asks for it (see autograder/README.md).
import sys  # noqa: E402

sys.path.insert(0, str(ROOT))  # the autograder package of this course
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties,
    CheckCellMetadata,
    GetGrades,
    IgnorePattern,
    LimitOutput,
    SaveAutoGrades,
)

from autograder import course  # noqa: E402
from autograder.nbgrader_plugins import (  # noqa: E402
    ExecuteUntilKernelDeath,
    HideHiddenTests,
    LabelForPage,
    NameLikelyBugs,
    feedback_exporter,
)

# One gradebook URL for nbgrader and the grader, with SQLite's busy timeout (course.py).
c.CourseDirectory.db_url = course.GRADEBOOK_URL

c.Autograde.autograde_preprocessors = [
    ExecuteUntilKernelDeath,
    IgnorePattern,
    ClearMetadataPreprocessor,
    LimitOutput,
    SaveAutoGrades,
    AssignLatePenalties,
    CheckCellMetadata,
]

# Feedback pages show visible tests and their failures, never hidden test code.
# The page is the course's own template, autograder/templates/feedback, in place of nbgrader's
# of that name (nbgrader's API asks for the template "feedback" by name; with this base folder
# set, nbgrader does not add its own): each test named with its exercise, failures marked,
# error lines wrapped, math as MathML (no MathJax from a network), and a small stylesheet of
# its own instead of Jupyter's and Bootstrap's inlined.
# A failed test whose error looks like a catalogued mistake gets a sentence naming it
# (autograder/likely_bugs.py), before the hidden tests' messages are removed.
c.GenerateFeedback.preprocessors = [GetGrades, NameLikelyBugs, HideHiddenTests, LabelForPage]
# nbconvert's HTML exporter less its BeautifulSoup pass, templates compiled once per worker
# (half a page's cost: autograder.nbgrader_plugins.FeedbackPageExporter).
c.GenerateFeedback.exporter_class = feedback_exporter()
c.HTMLExporter.extra_template_basedirs = [str(course.AUTOGRADER / "templates")]
