"""A worker's settings (autograder/worker.py): a section's cell timeout applies to it alone, and
each submission's settings reach nbgrader in a configuration of its own.
Grading itself runs in the class runs (test_grading_runs.py, test_hostile.py)."""

from __future__ import annotations

from autograder.worker import Settings


def test_a_sections_cell_timeout_applies_to_that_section_only():
    """A worker grades several sections: 99's own limit must not stick to the next one."""
    settings = Settings(cell_timeout_s={"99_catalogue": 20}, sandbox=True)
    assert settings.timeout_for("99_catalogue", 120) == 20
    assert settings.timeout_for("02_memory_sharding", 120) == 120
    everyone = Settings(cell_timeout_s={"*": 30, "99_catalogue": 20}, sandbox=True)
    assert everyone.timeout_for("02_memory_sharding", 120) == 30
    assert everyone.timeout_for("99_catalogue", 120) == 20


def test_each_submission_configures_nbgrader_alone():
    """A submission's settings reach nbgrader through a copy of the course's configuration:
    the configuration a worker loaded once, and the next submission, never see them."""
    from traitlets.config.loader import PyFileConfigLoader

    from autograder import course
    from autograder.worker import STAGED_SUBMISSIONS, Submission

    base = PyFileConfigLoader("nbgrader_config.py", path=str(course.AUTOGRADER)).load_config()
    configured = base.Execute.timeout
    settings = Settings(cell_timeout_s={"99_catalogue": 20}, sandbox=False, db_url="sqlite://")
    first = Submission.of(settings, "ann", "99_catalogue", 5.0, configured_timeout_s=configured)
    config = first.nbgrader_config(base)
    assert (config.Execute.timeout, config.CourseDirectory.db_url) == (20, "sqlite://")
    assert config.CourseDirectory.submitted_directory == STAGED_SUBMISSIONS
    assert config.SandboxedKernelManager.policy == ""  # no sandbox: kernels start as usual
    assert base.Execute.timeout == configured and base.CourseDirectory.db_url != "sqlite://"
    after = Submission.of(
        settings, "bob", "02_memory_sharding", 9.0, configured_timeout_s=configured
    )
    assert after.nbgrader_config(base).Execute.timeout == configured
    assert after.staged == course.ROOT / STAGED_SUBMISSIONS / "bob" / "02_memory_sharding"
    assert after.released == course.ROOT / settings.release_dir / "02_memory_sharding"
    sandboxed = Submission.of(
        Settings({}, sandbox=True), "ann", "99_catalogue", 5.0, configured_timeout_s=1, zygote="/z"
    )
    policy = sandboxed.nbgrader_config(base).SandboxedKernelManager.policy
    assert '"zygote": "/z"' in policy and str(sandboxed.autograded) in policy
