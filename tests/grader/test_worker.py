"""A worker's settings (autograder/worker.py): a section's cell timeout applies to it alone.
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
