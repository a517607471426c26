"""What autograder/README.md says of the class's tools holds: the grading-time table is
section_costs.json, and `make formgrader` starts nbgrader's formgrader for this course without
the exchange nbgrader cannot write."""

from __future__ import annotations

import json
import re
import subprocess

from tests.helpers import ROOT


def test_the_grading_time_table_is_section_costs_json():
    costs = json.loads((ROOT / "autograder" / "section_costs.json").read_text())
    text = (ROOT / "autograder" / "README.md").read_text()
    table = text[text.index("| section | Run-All | one submission graded |") :]
    table = table.split("\n\n")[0]
    rows = re.findall(r"^\| `(\w+)` \| (\d+) s \| (\d+) s \|$", table, re.M)
    found = {k: {"run_all": int(a), "graded": int(g)} for k, a, g in rows}
    assert found == costs, (found, costs)


def test_make_formgrader_starts_in_autograder_with_a_writable_exchange(tmp_path):
    done = subprocess.run(
        ["make", "-n", "formgrader", f"EXCHANGE={tmp_path}/exchange"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    out = done.stdout
    # nbgrader reads autograder/nbgrader_config.py from the working folder
    assert "cd autograder && " in out and "jupyter lab" in out, out
    assert f'--ServerApp.root_dir="{ROOT}"' in out, out  # the course root under the server's
    assert "c.Exchange.root" in out and 'course_id = "distopt"' in out, out
    assert f'"{tmp_path}/exchange"' in out, out
    for students_only in ("assignment_list", "course_list"):
        assert f"'nbgrader.server_extensions.{students_only}': False" in out, out
