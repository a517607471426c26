"""The course server (`make hub`) end to end: JupyterHub, its proxy, one JupyterLab per Unix
account, nbgrader's exchange and grading on submit (coursehub/).

Run as root (CI is): the hub makes a Unix account per student and starts each student's
server as that account. The students act through the hub's REST API with tokens of their own,
on the same server endpoints the assignment list's buttons call (fetch, submit, fetch
feedback) and the contents API the lab's editor saves through; one student then logs in
through the hub's form in headless Chromium, finds the section in the lab's Assignments list
and opens the graded result there.

- three students log in (password), fetch the catalogue section, answer it (the reference
  answers), leave it blank, or answer half; each submits; each has their result in
  ~/feedback/99_catalogue/ within RESULT_S; the instructor collects, `make grade`'s module
  gives the same scores; feedback is released and fetched back;
- no student reads another's home or submission, the exchange's inbound list, or the
  instructor's files;
- 50 accounts submit at once through nbgrader's exchange (catalogue cases, hostile ones
  included): each submission is in the ledger once, graded once, with its case's score.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import pytest
import requests

from autograder import fixtures
from autograder.catalogue import cases
from e2e.lab_page import poll

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
SECTION, NOTEBOOK = cases.SECTION, cases.NOTEBOOK
TRIO = ["hubs-full", "hubs-blank", "hubs-half"]
CROWD = [f"hubl-{i:02d}" for i in range(50)]
RESULT_S = 240  # submit to result in the student's home, at most (2 cores, 3 at once)
CROWD_S = 900  # 50 submissions graded, at most
# catalogue cases for the crowd: quick ones, hostile ones among them, none that needs a
# cgroup per submission or waits out a timeout
CROWD_CASES = [
    name
    for name in [
        "honest-complete",
        "honest-blank",
        "print-hidden-tests",
        "kernel-exit",
        "syntax-error",
        "not-json",
        "empty-file",
        "no-cells",
        "renamed",
        "extra-files",
        "deleted-tests",
        "edited-tests",
        "forged-outcome-records",
        "patch-numpy",
    ]
    if name in cases.CASES and not cases.CASES[name].cgroups
]

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="the hub makes Unix accounts: root")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_user(user: str, *cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *cmd], capture_output=True, text=True, **kw)


class Hub:
    def __init__(self, course: Path, state: Path, students: list[str]):
        self.course, self.state, self.students = course, state, students
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_hex(24)
        self.env = dict(
            os.environ,
            COURSEHUB_ROOT=str(course),
            COURSEHUB_STATE=str(state),
            COURSEHUB_PORT=str(self.port),
            COURSEHUB_STUDENTS=",".join(students),
            COURSEHUB_ADMIN_TOKEN=self.token,
            COURSEHUB_SERVICE_PORT=str(free_port()),
            PYTHONPATH=str(ROOT),
        )
        self.log = open(state.parent / "hub.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [str(PYTHON), "-m", "coursehub.start", "--section", SECTION],
            cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.admin = requests.Session()
        self.admin.headers["Authorization"] = f"token {self.token}"

        def up():
            assert self.proc.poll() is None, f"make hub exited: {self.tail()}"
            try:
                return requests.get(f"{self.url}/hub/api/", timeout=5).status_code == 200
            except requests.ConnectionError:
                return None

        poll(up, timeout_s=300, what="the hub to answer")

    def tail(self) -> str:
        return (self.state.parent / "hub.log").read_text(errors="replace")[-4000:]

    def api(self, method: str, path: str, **kw) -> requests.Response:
        r = self.admin.request(method, f"{self.url}/hub/api{path}", timeout=60, **kw)
        assert r.status_code < 400, f"{method} {path}: {r.status_code} {r.text}"
        return r

    def login(self, user: str, password: str):
        """The login form as a browser posts it: (the answer, the cookies it left)."""
        s = requests.Session()
        form = s.get(f"{self.url}/hub/login", timeout=30).text
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', form).group(1)
        r = s.post(
            f"{self.url}/hub/login",
            data={"username": user, "password": password, "_xsrf": xsrf},
            allow_redirects=False,
            timeout=30,
        )
        return r, s.cookies

    def start_server(self, user: str) -> requests.Session:
        """The student's JupyterLab started by the hub; a session with the student's token."""
        self.api("POST", f"/users/{user}/server")

        def ready():
            return self.api("GET", f"/users/{user}").json()["servers"].get("", {}).get("ready")

        poll(ready, timeout_s=180, what=f"{user}'s server")
        token = self.api("POST", f"/users/{user}/tokens", json={"expires_in": 3600}).json()
        s = requests.Session()
        s.headers["Authorization"] = f"token {token['token']}"
        s.base = f"{self.url}/user/{user}"
        return s

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the hub stops servers, service, proxy
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        for user in self.students:  # nothing of a student's may outlive the test
            out = subprocess.run(["ps", "-u", user, "-o", "pid="], capture_output=True, text=True)
            for pid in out.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    import sysconfig

    from coursehub.start import reachable_by_all

    purelib = Path(sysconfig.get_paths()["purelib"])
    if not reachable_by_all(purelib):  # e.g. a checkout inside root's home (mode 0700)
        pytest.skip(f"students' accounts cannot enter {purelib}: the hub cannot serve them")
    course = fixtures.copy_course(tmp_path_factory.mktemp("hub") / "course")
    cases.install(course)
    done = subprocess.run(
        [str(PYTHON), "-m", "autograder.release", SECTION], cwd=course,
        env=dict(os.environ, PYTHONPATH=str(course)), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # the students pass through the state folder to the exchange: not a 0700 pytest folder
    state = Path(tempfile.mkdtemp(prefix="coursehub-", dir="/tmp")) / "state"
    os.chmod(state.parent, 0o711)
    students = TRIO + CROWD
    h = Hub(course, state, students)
    try:
        yield h
    finally:
        h.stop()
        artifacts = ROOT / "artifacts"
        artifacts.mkdir(exist_ok=True)
        shutil.copy(state.parent / "hub.log", artifacts / "coursehub.log")
        for user in students:
            subprocess.run(["userdel", "--remove", user], capture_output=True)
        shutil.rmtree(state.parent, ignore_errors=True)


def rss_mb(user: str) -> float:
    """Resident memory of the user's processes (their single-user server), in MB."""
    out = subprocess.run(["ps", "-u", user, "-o", "rss="], capture_output=True, text=True)
    return sum(int(x) for x in out.stdout.split()) / 1024


def in_chromium(hub: Hub, user: str, headline: str, profile: Path) -> str:
    """Log in at the hub's form, open the Assignments list and the result file in the lab."""
    from selenium.webdriver.common.by import By

    from e2e.lab_page import start_chromium

    driver = start_chromium(profile)
    t0 = time.monotonic()
    try:
        driver.get(f"{hub.url}/hub/login")
        poll(lambda: driver.find_elements(By.ID, "username_input"), timeout_s=60, what="login form")
        driver.find_element(By.ID, "username_input").send_keys(user)
        driver.find_element(By.ID, "password_input").send_keys("course-demo-password")
        driver.find_element(By.ID, "login_submit").click()
        poll(lambda: f"/user/{user}/lab" in driver.current_url, timeout_s=180, what="the lab")
        menu = "//div[contains(@class, 'lm-MenuBar-itemLabel') and text()='Nbgrader']"
        poll(lambda: driver.find_elements(By.XPATH, menu), timeout_s=120, what="Nbgrader menu")
        driver.find_element(By.XPATH, menu).click()
        item = "//div[contains(@class, 'lm-Menu-itemLabel') and text()='Assignment List']"
        poll(lambda: driver.find_elements(By.XPATH, item), timeout_s=30, what="its item")
        driver.find_element(By.XPATH, item).click()

        def listed():
            found = driver.find_elements(By.ID, "nbgrader-assignment-list")
            return found and SECTION in found[0].text and found[0].text

        listing = poll(listed, timeout_s=120, what=f"{SECTION} in the Assignments list")
        driver.get(f"{hub.url}/user/{user}/lab/tree/feedback/{SECTION}/result.md")

        def shown():  # the result file open in the lab's editor, its first line on screen
            tab = driver.find_elements(By.CSS_SELECTOR, ".lm-TabBar-tab.lm-mod-current")
            editor = driver.find_elements(By.CSS_SELECTOR, ".jp-FileEditor .cm-content")
            return (
                any(t.text.strip() == "result.md" for t in tab)
                and editor
                and headline in editor[0].text
            )

        poll(shown, timeout_s=120, what=f"{headline!r} in result.md, open in the lab")
        took = time.monotonic() - t0
        return f"listed ({' '.join(listing.split()[:8])} ...), result shown, {took:.0f} s"
    finally:
        artifacts = ROOT / "artifacts"
        artifacts.mkdir(exist_ok=True)
        driver.save_screenshot(str(artifacts / "coursehub-student.png"))
        driver.quit()


def test_three_students_fetch_submit_and_see_their_grade(hub, tmp_path_factory):
    # a real login with the demo password, and none with a wrong one
    for user in TRIO:
        ok, cookies = hub.login(user, "course-demo-password")
        assert ok.status_code == 302 and "jupyterhub-hub-login" in cookies, ok.text[:300]
        bad, cookies = hub.login(user, "wrong-password")
        assert bad.status_code == 403 and "jupyterhub-hub-login" not in cookies

    sessions = {user: hub.start_server(user) for user in TRIO}
    for s in sessions.values():
        listed = s.get(f"{s.base}/assignments", params={"course_id": "distopt"}, timeout=60)
        assert listed.status_code == 200, listed.text
        released = [a for a in listed.json()["value"] if a["assignment_id"] == SECTION]
        assert released and released[0]["status"] == "released", listed.text
        fetched = s.post(
            f"{s.base}/assignments/fetch",
            json={"course_id": "distopt", "assignment_id": SECTION},
            timeout=120,
        )
        assert fetched.status_code == 200, fetched.text
    print(f"\nsingle-user server RSS: {', '.join(f'{rss_mb(u):.0f} MB' for u in TRIO)}")

    released = nbformat.read(hub.course / "notebooks" / SECTION / f"{NOTEBOOK}.ipynb", 4)
    ids = fixtures.answer_ids(released)
    notebooks = {
        "hubs-full": fixtures.answered_notebook(SECTION, NOTEBOOK, root=hub.course),
        "hubs-blank": None,  # submitted as fetched
        "hubs-half": fixtures.answered_notebook(
            SECTION, NOTEBOOK, root=hub.course, unanswered=set(ids[len(ids) // 2 :])
        ),
    }
    path = f"api/contents/{SECTION}/{NOTEBOOK}.ipynb"
    for user, nb in notebooks.items():
        s = sessions[user]
        if nb is not None:  # saved as the lab's editor saves
            r = s.put(f"{s.base}/{path}", json={"type": "notebook", "content": nb}, timeout=60)
            assert r.status_code == 200, r.text
    submitted_at = {}
    for user in TRIO:
        s = sessions[user]
        r = s.post(
            f"{s.base}/assignments/submit",
            json={"course_id": "distopt", "assignment_id": SECTION},
            timeout=120,
        )
        assert r.status_code == 200 and r.json()["success"], r.text
        submitted_at[user] = time.monotonic()

    results, took = {}, {}
    for user in TRIO:
        s = sessions[user]

        def result(user=user, s=s):
            r = s.get(f"{s.base}/api/contents/feedback/{SECTION}/result.md", timeout=30)
            return r.json()["content"] if r.status_code == 200 else None

        results[user] = poll(result, timeout_s=RESULT_S, what=f"{user}'s result")
        took[user] = time.monotonic() - submitted_at[user]
    print("submit to result: " + ", ".join(f"{u} {t:.0f} s" for u, t in took.items()))
    ledger = [json.loads(x) for x in (hub.state / "ledger.jsonl").read_text().splitlines()]
    graded = {e["student"]: e for e in ledger if e["status"] == "graded" and e["student"] in TRIO}
    assert float(graded["hubs-full"]["score"]) == cases.MAX_SCORE, results["hubs-full"]
    assert float(graded["hubs-blank"]["score"]) == 0, results["hubs-blank"]
    half = float(graded["hubs-half"]["score"])
    assert 0 < half < cases.MAX_SCORE, results["hubs-half"]
    for user in TRIO:
        assert f"{float(graded[user]['score']):g}" in results[user].replace(".0 ", " "), results
    # in a real browser: the student logs in through the hub's form, finds the section in the
    # lab's Assignments list (nbgrader's extension), and opens the result where grading put it
    headline = results["hubs-half"].splitlines()[0].lstrip("# ")  # "<section>: X of Y points"
    seen = in_chromium(hub, "hubs-half", headline, tmp_path_factory.mktemp("chromium"))
    print(f"hubs-half in Chromium: {seen}")

    # the feedback page beside it: visible results, never hidden test code
    hidden = [
        line.strip()
        for cell in nbformat.read(hub.course / "solutions" / SECTION / f"{NOTEBOOK}.ipynb", 4).cells
        if "### BEGIN HIDDEN TESTS" in cell.source
        for line in cell.source.split("### BEGIN HIDDEN TESTS")[1].splitlines()
        if len(line.strip()) >= 12 and "###" not in line
    ]
    s = sessions["hubs-blank"]
    page = s.get(f"{s.base}/files/feedback/{SECTION}/{NOTEBOOK}.html", timeout=30)
    assert page.status_code == 200, page.text[:300]
    assert hidden and not [line for line in hidden if line in page.text]

    # nobody reads another's work or the instructor's files
    home = {u: Path(pwd.getpwnam(u).pw_dir) for u in TRIO}
    inbound = hub.state / "exchange" / "distopt" / "inbound"
    one = next(inbound.glob("hubs-full+*"))
    for who, path in [
        ("hubs-blank", home["hubs-full"] / SECTION / f"{NOTEBOOK}.ipynb"),
        ("hubs-blank", home["hubs-full"] / "feedback"),
        ("hubs-half", inbound),
        ("hubs-half", hub.course / "autograder" / "submitted"),
        ("hubs-half", hub.course / "solutions" / SECTION / f"{NOTEBOOK}.ipynb"),
        ("hubs-half", hub.course / "autograder" / "gradebook.db"),
    ]:
        denied = as_user(who, "cat" if path.suffix else "ls", str(path))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (who, path)
    # a submission's name carries a random part: no student can guess another's folder
    assert len(one.name.split("+")) == 4

    # the instructor collects; the class run gives the same scores
    env = dict(hub.env, PYTHONPATH=f"{hub.course}:{ROOT}")
    done = subprocess.run(
        [str(PYTHON), "-m", "coursehub.instructor", "collect", SECTION],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = subprocess.run(
        [str(PYTHON), "-m", "autograder.grade", "--section", SECTION, "--student", ",".join(TRIO)],
        cwd=hub.course, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {
        r.split(",")[0]: r.split(",")
        for r in (hub.course / "autograder" / "grades.csv").read_text().splitlines()[1:]
    }
    for user in TRIO:
        assert float(rows[user][2]) == float(graded[user]["score"]), (user, rows[user])

    # feedback released by the instructor, fetched back from the lab
    done = subprocess.run(
        [str(PYTHON), "-m", "coursehub.instructor", "feedback", SECTION],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for user in TRIO:
        s = sessions[user]
        r = s.post(
            f"{s.base}/assignments/fetch_feedback",
            json={"course_id": "distopt", "assignment_id": SECTION},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        mine = [
            a
            for a in r.json()["value"]
            if a["assignment_id"] == SECTION and a["status"] == "submitted"
        ]
        assert any(sub.get("has_local_feedback") for sub in mine[0]["submissions"]), r.text
        hub.api("DELETE", f"/users/{user}/server")


def test_fifty_students_submit_at_once(hub):
    """50 accounts run nbgrader's submit at the same moment, each as themselves."""
    ctx = cases.Context(root=hub.course, host_port=9)
    work = Path(tempfile.mkdtemp(prefix="coursehub-crowd-", dir="/tmp"))
    os.chmod(work, 0o755)
    expected = {}
    for i, user in enumerate(CROWD):
        name = CROWD_CASES[i % len(CROWD_CASES)]
        folder = work / user / SECTION
        cases.CASES[name].write(folder, ctx)
        expected[user] = (name, cases.CASES[name].score)
        subprocess.run(["chown", "-R", user, str(work / user)], check=True)
    barrier = threading.Barrier(len(CROWD))
    outcome = {}

    def submit(user):
        barrier.wait()
        outcome[user] = as_user(
            user, str(ROOT / "coursehub" / "student_env" / "bin" / "python"), "-m", "nbgrader",
            "submit", SECTION,
            "--course=distopt", f"--Exchange.root={hub.state / 'exchange'}",
            cwd=work / user, timeout=600,
            env=dict(os.environ, HOME=str(work / user)),
        )  # fmt: skip

    start = time.monotonic()
    threads = [threading.Thread(target=submit, args=(u,)) for u in CROWD]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    submitted_s = time.monotonic() - start
    failed = {u: o.stderr[-500:] for u, o in outcome.items() if o.returncode != 0}
    assert not failed, failed
    ledger_path = hub.state / "ledger.jsonl"

    def all_graded():
        lines = [json.loads(x) for x in ledger_path.read_text().splitlines()]
        done = [e for e in lines if e["student"] in CROWD and e["status"] == "graded"]
        return lines if len(done) >= len(CROWD) else None

    lines = poll(all_graded, timeout_s=CROWD_S, what="50 submissions graded")
    took = time.monotonic() - start
    graded = [e for e in lines if e["student"] in CROWD and e["status"] == "graded"]
    assert sorted(e["student"] for e in graded) == sorted(CROWD), "a student graded twice"
    assert len({e["name"] for e in graded}) == len(CROWD)
    seen = {e["name"] for e in lines if e["student"] in CROWD}
    inbound = {p.name for p in (hub.state / "exchange" / "distopt" / "inbound").glob("hubl-*")}
    assert seen == inbound, "a submission in the exchange was never seen, or one vanished"
    wrong = {
        e["student"]: (expected[e["student"]], e["score"], e["note"])
        for e in graded
        if float(e["score"] or -1) != expected[e["student"]][1]
    }
    assert not wrong, wrong
    lag = sorted(e["graded_at"] - e["seen_at"] for e in graded)
    print(
        f"\n50 submissions: nbgrader submit of all took {submitted_s:.0f} s; all graded "
        f"{took:.0f} s after the start; arrival to grade: median {lag[25]:.0f} s, "
        f"max {lag[-1]:.0f} s"
    )
    shutil.rmtree(work, ignore_errors=True)


def test_after_the_deadline_is_kept_not_graded(hub):
    """A submission after the student's deadline (class.toml) stays in the exchange, is not
    graded, and the student is told the last one before the deadline counts."""
    (hub.course / "autograder" / "class.toml").write_text(
        f"[due]\n{SECTION} = 2026-01-01T00:00:00\n", encoding="utf-8"
    )
    user = CROWD[0]
    work = Path(tempfile.mkdtemp(prefix="coursehub-late-", dir="/tmp"))
    os.chmod(work, 0o755)
    cases.CASES["honest-complete"].write(work / SECTION, cases.Context(hub.course, 9))
    subprocess.run(["chown", "-R", user, str(work)], check=True)
    before = {p.name for p in (hub.state / "exchange" / "distopt" / "inbound").iterdir()}
    done = as_user(
        user, str(ROOT / "coursehub" / "student_env" / "bin" / "python"), "-m", "nbgrader",
        "submit", SECTION, "--course=distopt", f"--Exchange.root={hub.state / 'exchange'}",
        cwd=work, timeout=300, env=dict(os.environ, HOME=str(work)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    new = {p.name for p in (hub.state / "exchange" / "distopt" / "inbound").iterdir()} - before
    assert len(new) == 1

    def recorded():
        for line in (hub.state / "ledger.jsonl").read_text().splitlines():
            entry = json.loads(line)
            if entry["name"] in new:
                return entry
        return None

    entry = poll(recorded, timeout_s=60, what="the late submission in the ledger")
    assert entry["status"] == "late" and "before the deadline" in entry["note"], entry
    told = Path(pwd.getpwnam(user).pw_dir) / "feedback" / SECTION / "late.md"
    assert "before the deadline" in told.read_text(), told.read_text()
    time.sleep(3)  # one more scan: it is not graded after all
    assert all(json.loads(x)["status"] != "graded" or json.loads(x)["name"] not in new
               for x in (hub.state / "ledger.jsonl").read_text().splitlines())  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
