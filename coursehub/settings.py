"""Where the course server keeps its parts; every value can be set from the environment.

COURSEHUB_ROOT      the instructor's course: a checkout of this repository (default: this one)
COURSEHUB_STATE     the hub's own state: database, cookie secret, exchange (default coursehub/state)
COURSEHUB_PORT      the port students open (default 8000)
COURSEHUB_HUB_PORT  the hub's own port behind the proxy (default COURSEHUB_PORT + 1)
COURSEHUB_PROXY_API_PORT  the proxy's REST API, which the hub drives (default COURSEHUB_PORT + 2)
COURSEHUB_STUDENTS  comma-separated Unix accounts of the students (default student1..3)
COURSEHUB_PASSWORD  the demo's shared password (SharedPasswordAuthenticator)
COURSEHUB_MIN_MINUTES  minutes between two gradings of one student's section (the rate limit)
COURSEHUB_JOBS      submissions the grading service grades at once (default: make grade's, 2)
COURSEHUB_MEM_LIMIT memory cap of one student's server (default 2G)
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = Path(os.environ.get("COURSEHUB_ROOT", HERE.parent)).resolve()
STATE = Path(os.environ.get("COURSEHUB_STATE", HERE / "state")).resolve()
EXCHANGE = STATE / "exchange"
STUDENT_CONFIG = STATE / "student_config"  # JUPYTER_CONFIG_PATH of the students' servers
LEDGER = STATE / "ledger.jsonl"  # one line per submission the grading service saw
PORT = int(os.environ.get("COURSEHUB_PORT", "8000"))
COURSE_ID = "distopt"
INSTRUCTOR = "instructor"
STUDENTS = [
    s.strip()
    for s in os.environ.get("COURSEHUB_STUDENTS", "student1,student2,student3").split(",")
    if s.strip()
]
PASSWORD = os.environ.get("COURSEHUB_PASSWORD", "course-demo-password")
MIN_MINUTES = float(os.environ.get("COURSEHUB_MIN_MINUTES", "0"))
PYTHON = HERE.parent / ".venv" / "bin" / "python"
# The students' Python: the course's .venv seen through a venv of a Python that every account
# can run (the .venv's own base may sit in root's home, closed to students); start.py makes it.
STUDENT_ENV = HERE / "student_env"
STUDENT_PYTHON = STUDENT_ENV / "bin" / "python"
PROXY = HERE / "node_modules" / ".bin" / "configurable-http-proxy"
HUB_PORT = int(os.environ.get("COURSEHUB_HUB_PORT", str(PORT + 1)))
PROXY_API_PORT = int(os.environ.get("COURSEHUB_PROXY_API_PORT", str(PORT + 2)))
SERVICE_NAME = "grader"
# Every port `make hub` binds, what binds it and the variable that moves it (start.py checks
# each is free before it starts anything).
PORTS = [
    (PORT, "the hub's public address (the proxy)", "COURSEHUB_PORT"),
    (HUB_PORT, "the hub itself, behind the proxy", "COURSEHUB_HUB_PORT"),
    (PROXY_API_PORT, "the proxy's REST API", "COURSEHUB_PROXY_API_PORT"),
]
