"""The course server (`make hub`) end to end: JupyterHub, its proxy, one JupyterLab per Unix
account, nbgrader's exchange and grading on submit (coursehub/).

Run as root (CI is): the hub makes a Unix account per student and starts each student's
server as that account. The students act through the hub's REST API with tokens of their own,
on the same server endpoints the assignment list's buttons call (fetch, submit, fetch
feedback) and the contents API the lab's editor saves through; one student then logs in
through the hub's form in headless Chromium, finds the section in the lab's Assignment List
and opens the graded result there.

- three students log in (password), fetch the catalogue section, answer it (the reference
  answers), leave it blank, or answer half; Validate passes the answered and fails the blank
  one; each submits; each has their result in the submission's feedback folder,
  ~/99_catalogue/feedback/<timestamp>/, within RESULT_S, and the Assignment List shows it; the
  instructor collects, `make grade`'s module gives the same scores; feedback is released and
  fetched back into the same folder;
- no student reads another's home or submission, the exchange's inbound list, or the
  instructor's files;
- 50 accounts submit at once through nbgrader's exchange (catalogue cases, hostile ones
  included): each submission is in the ledger once, graded once, with its case's score;
- one student submits on time, then late: the grading service and the instructor's collect +
  the class run count the same submission with the same lateness (result.md, grades.csv,
  grades_lms.csv); another's Assignment List shows a graded, a waiting and a late submission
  (screenshot: artifacts/screenshots/coursehub_assignment_list.png);
- `make hub` itself starts on its default ports, and refuses to start a second time while
  they are taken (first in this module, before the test hub on free ports starts).
"""

from __future__ import annotations

import csv
import datetime as dt
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
import urllib.parse
from pathlib import Path

import nbformat
import pytest
import requests

from autograder import fixtures
from autograder.catalogue import cases
from coursehub import counted
from e2e.lab_page import poll

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
SECTION, NOTEBOOK = cases.SECTION, cases.NOTEBOOK
TRIO = ["hubs-full", "hubs-blank", "hubs-half"]
TWICE, LISTED = "hubs-twice", "hubs-list"  # on time then late; the Assignment List's states
LATE_ONLY = "hubs-late"  # late, with nothing on time
MIN_MINUTES = 10  # the test hub's rate limit: a second grading within it waits
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
            COURSEHUB_HUB_PORT=str(free_port()),
            COURSEHUB_PROXY_API_PORT=str(free_port()),
            COURSEHUB_MIN_MINUTES=str(MIN_MINUTES),
            COURSEHUB_REPORT_S="3",  # the class report, 3 s after the last grading
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
    students = TRIO + [TWICE, LISTED, LATE_ONLY] + CROWD
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


def feedback_folders(s: requests.Session) -> dict[str, str]:
    """The student's feedback folders of the section (nbgrader's, one per submission, named
    by its timestamp) and the result.md in each, read through the lab's contents API."""
    r = s.get(f"{s.base}/api/contents/{SECTION}/feedback", timeout=30)
    if r.status_code != 200:
        return {}
    found = {}
    for item in r.json()["content"]:
        if item["type"] != "directory":
            continue
        path = urllib.parse.quote(f"{SECTION}/feedback/{item['name']}/result.md")
        page = s.get(f"{s.base}/api/contents/{path}", timeout=30)
        if page.status_code == 200:
            found[item["name"]] = page.json()["content"]
    return found


def submit_through_lab(hub: Hub, user: str, s: requests.Session) -> str:
    """Press Submit (the assignment list's endpoint); the new submission's nbgrader timestamp
    (the name of its feedback folder), read from the exchange's inbound folder."""
    inbound = hub.state / "exchange" / "distopt" / "inbound"
    before = {p.name for p in inbound.glob(f"{user}+{SECTION}+*")}
    r = s.post(
        f"{s.base}/assignments/submit",
        json={"course_id": "distopt", "assignment_id": SECTION},
        timeout=120,
    )
    assert r.status_code == 200 and r.json()["success"], r.text
    [new] = {p.name for p in inbound.glob(f"{user}+{SECTION}+*")} - before
    return new.split("+")[2]


def listed_states(s: requests.Session) -> list[str]:
    """The student's submissions as the Assignment List shows them: time, then state."""
    r = s.get(f"{s.base}/assignments", params={"course_id": "distopt"}, timeout=60)
    assert r.status_code == 200 and r.json()["success"], r.text
    mine = [a for a in r.json()["value"] if a["assignment_id"] == SECTION]
    return sorted(sub["timestamp"] for a in mine for sub in a.get("submissions", []))


def ledger(hub: Hub) -> dict[str, dict]:
    """The grading service's ledger: the last state of each submission, by folder name."""
    entries = {}
    for line in (hub.state / "ledger.jsonl").read_text().splitlines():
        entry = json.loads(line)
        entries[entry["name"]] = entry
    return entries


def open_assignment_list(driver, hub: Hub, user: str) -> str:
    """Log in at the hub's form and open the lab's Assignment List (Nbgrader menu); its text
    once the section is listed."""
    from selenium.webdriver.common.by import By

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

    return poll(listed, timeout_s=120, what=f"{SECTION} in the Assignment List")


def in_chromium(hub: Hub, user: str, headline: str, result: str, profile: Path) -> str:
    """Log in at the hub's form, open the Assignment List and the result file in the lab."""
    from selenium.webdriver.common.by import By

    from e2e.lab_page import start_chromium

    driver = start_chromium(profile)
    t0 = time.monotonic()
    try:
        listing = open_assignment_list(driver, hub, user)
        driver.get(f"{hub.url}/user/{user}/lab/tree/{urllib.parse.quote(result)}")

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
        artifacts = ROOT / "artifacts" / "screenshots"
        artifacts.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(artifacts / "coursehub_result.png"))
        driver.quit()


def assignment_list_in_chromium(hub: Hub, user: str, states: list[str], profile: Path) -> Path:
    """The student's Assignment List in Chromium, every one of ``states`` on screen; its
    screenshot."""
    from selenium.webdriver.common.by import By

    from e2e.lab_page import start_chromium

    shot = ROOT / "artifacts" / "screenshots" / "coursehub_assignment_list.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    driver = start_chromium(profile)
    try:
        driver.set_window_size(1400, 900)
        open_assignment_list(driver, hub, user)

        def all_shown():
            found = driver.find_elements(By.ID, "nbgrader-assignment-list")
            text = found[0].text if found else ""
            return all(state in text for state in states) and text

        try:
            poll(all_shown, timeout_s=60, what=f"{states} in the Assignment List")
        finally:
            driver.save_screenshot(str(shot))
        return shot
    finally:
        driver.quit()


def test_make_hub_starts_on_its_defaults(tmp_path):
    """`make hub` as documented: its default ports (8000 public, 8001 the hub, 8002 the
    proxy's API), a second start refused while they are taken, nothing left when stopped.
    A scratch course and state, so that the checkout's own files are not touched."""
    defaults = {
        8000: "COURSEHUB_PORT",
        8001: "COURSEHUB_HUB_PORT",
        8002: "COURSEHUB_PROXY_API_PORT",
    }
    taken = _taken(defaults)
    if taken:
        pytest.skip(f"the default ports {taken} are taken on this machine: make hub would refuse")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COURSEHUB_")}
    env.pop("MAKEFLAGS", None)  # not the make that runs this test's
    course = fixtures.copy_course(tmp_path / "course")
    cases.install(course)
    done = subprocess.run(
        [str(PYTHON), "-m", "autograder.release", SECTION], cwd=course,
        env=dict(os.environ, PYTHONPATH=str(course)), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    state = Path(tempfile.mkdtemp(prefix="coursehub-defaults-", dir="/tmp")) / "state"
    os.chmod(state.parent, 0o711)
    env.update(
        COURSEHUB_ROOT=str(course), COURSEHUB_STATE=str(state), COURSEHUB_STUDENTS=DEFAULTS_USER
    )
    log = open(state.parent / "make-hub.log", "w")  # noqa: SIM115 (closed below)
    make = subprocess.Popen(
        ["make", "--no-print-directory", "hub", f"SECTION={SECTION}"], cwd=ROOT, env=env,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:

        def up():
            assert make.poll() is None, (state.parent / "make-hub.log").read_text()[-3000:]
            try:
                return requests.get("http://127.0.0.1:8000/hub/api/", timeout=5).ok
            except requests.ConnectionError:
                return None

        poll(up, timeout_s=300, what="make hub on http://127.0.0.1:8000/")
        assert requests.get("http://127.0.0.1:8001/hub/api/", timeout=10).ok  # the hub itself
        proxy_api = requests.get("http://127.0.0.1:8002/api/routes", timeout=10)
        assert proxy_api.status_code == 403, proxy_api.status_code  # the proxy's, token needed
        # a second make hub while the first runs: refused, naming the port and its variable
        again = subprocess.run(
            ["make", "--no-print-directory", "hub", f"SECTION={SECTION}"], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert again.returncode != 0, again.stdout
        for port, variable in defaults.items():
            assert f"port {port} (" in again.stderr and variable in again.stderr, again.stderr
        assert "nothing was started" in again.stderr
        assert requests.get("http://127.0.0.1:8000/hub/api/", timeout=10).ok  # still serving
        proxy = int((state / "proxy.pid").read_text())
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGTERM)
            try:
                make.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(make.pid, signal.SIGKILL)
                make.wait()
        log.close()
        artifacts = ROOT / "artifacts"
        artifacts.mkdir(exist_ok=True)
        shutil.copy(state.parent / "make-hub.log", artifacts / "coursehub-defaults.log")
        subprocess.run(["userdel", "--remove", DEFAULTS_USER], capture_output=True)
        shutil.rmtree(state.parent, ignore_errors=True)
    # stopped: every default port free again, no proxy of this hub left
    poll(lambda: not _taken(defaults), timeout_s=30, what="the default ports to be free")
    assert not Path(f"/proc/{proxy}").exists(), f"the proxy ({proxy}) outlived make hub"


DEFAULTS_USER = "hubd-one"


def _taken(ports: dict[int, str]) -> list[int]:
    """The ports of ``ports`` that something listens on."""
    taken = []
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                taken.append(port)
    return taken


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
    # no "Jupyter news" prompt for students: the lab's own settings say Never
    s = sessions[TRIO[0]]
    r = s.get(f"{s.base}/lab/api/settings/@jupyterlab/apputils-extension:notification", timeout=60)
    assert r.status_code == 200, r.text[:500]  # the course's default, under the student's own
    assert r.json()["schema"]["properties"]["fetchNews"]["default"] == "false", r.text[:2000]

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
    # the self-check a hub student has (no course checkout there): nbgrader's Validate button,
    # the endpoint it calls, on the student's own server
    path = f"{SECTION}/{NOTEBOOK}.ipynb"
    for user, passes in [("hubs-full", True), ("hubs-blank", False)]:
        s = sessions[user]
        r = s.post(f"{s.base}/assignments/validate", data={"path": path}, timeout=300)
        assert r.status_code == 200 and r.json()["success"], r.text[:2000]
        assert ("failed" not in r.json()["value"]) == passes, (user, r.text[:2000])
    # and its command in a lab terminal, as the README says (the student's own Python)
    home_full = Path(pwd.getpwnam("hubs-full").pw_dir)
    done = as_user(
        "hubs-full", str(ROOT / "coursehub" / "student_env" / "bin" / "python"), "-m",
        "nbgrader", "validate", path, cwd=home_full, timeout=300,
        env={"HOME": str(home_full), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
             "OMP_NUM_THREADS": "1", "JUPYTER_CONFIG_PATH": str(hub.state / "student_config")},
    )  # fmt: skip
    assert done.returncode == 0 and "Success!" in done.stdout, done.stdout + done.stderr

    submitted_at, stamps = {}, {}
    for user in TRIO:
        stamps[user] = submit_through_lab(hub, user, sessions[user])
        submitted_at[user] = time.monotonic()

    results, took = {}, {}
    for user in TRIO:
        s = sessions[user]

        def result(user=user, s=s):
            text = feedback_folders(s).get(stamps[user], "")
            return text if text.startswith(f"# {SECTION}: graded, ") else None

        results[user] = poll(result, timeout_s=RESULT_S, what=f"{user}'s result")
        took[user] = time.monotonic() - submitted_at[user]
    print("submit to result: " + ", ".join(f"{u} {t:.0f} s" for u, t in took.items()))
    graded = {
        e["student"]: e
        for e in ledger(hub).values()
        if e["status"] == "graded" and e["student"] in TRIO
    }
    assert float(graded["hubs-full"]["score"]) == cases.MAX_SCORE, results["hubs-full"]
    assert float(graded["hubs-blank"]["score"]) == 0, results["hubs-blank"]
    half = float(graded["hubs-half"]["score"])
    assert 0 < half < cases.MAX_SCORE, results["hubs-half"]
    for user in TRIO:  # the score as the feedback page writes it ("2.0 of 5.0 points")
        score = round(float(graded[user]["score"]), 2)
        head = f"# {SECTION}: graded, {score} of {float(cases.MAX_SCORE)} points"
        assert results[user].splitlines()[0] == head, results[user]
        assert "autograder/" not in results[user] and ".000" not in results[user], results[user]
    # the Assignment List shows each submission's state beside its time
    for user in TRIO:
        score = round(float(graded[user]["score"]), 2)
        shown = listed_states(sessions[user])
        head = f": graded, {score} of {float(cases.MAX_SCORE)} points"
        assert any(line.endswith(head) for line in shown), shown
    # in a real browser: the student logs in through the hub's form, finds the section in the
    # lab's Assignment List (nbgrader's extension), and opens the result where grading put it
    headline = results["hubs-half"].splitlines()[0].lstrip("# ")  # "<section>: graded, X of Y"
    result = f"{SECTION}/feedback/{stamps['hubs-half']}/result.md"
    seen = in_chromium(hub, "hubs-half", headline, result, tmp_path_factory.mktemp("chromium"))
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
    folder = urllib.parse.quote(f"{SECTION}/feedback/{stamps['hubs-blank']}")
    page = s.get(f"{s.base}/files/{folder}/{NOTEBOOK}.html", timeout=30)
    assert page.status_code == 200, page.text[:300]
    assert hidden and not [line for line in hidden if line in page.text]

    # nobody reads another's work or the instructor's files
    home = {u: Path(pwd.getpwnam(u).pw_dir) for u in TRIO}
    inbound = hub.state / "exchange" / "distopt" / "inbound"
    one = next(inbound.glob("hubs-full+*"))
    for user in TRIO:  # one feedback folder: nbgrader's, none of the service's own
        assert not (home[user] / "feedback").exists(), user
    for who, path in [
        ("hubs-blank", home["hubs-full"] / SECTION / f"{NOTEBOOK}.ipynb"),
        ("hubs-blank", home["hubs-full"] / SECTION / "feedback"),
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
        # Fetch Feedback put the instructor's page into the folder grading on submit wrote
        assert list(feedback_folders(s)) == [stamps[user]], feedback_folders(s)
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
    # from arrival in the exchange (nbgrader's timestamp), not from when the service saw it
    lag = sorted(e["graded_at"] - dt.datetime.fromisoformat(e["submitted_at"]).timestamp()
                 for e in graded)  # fmt: skip
    print(
        f"\n50 submissions: nbgrader submit of all took {submitted_s:.0f} s; all graded "
        f"{took:.0f} s after the start; arrival to result: median {lag[25]:.0f} s, "
        f"max {lag[-1]:.0f} s"
    )
    shutil.rmtree(work, ignore_errors=True)


def test_a_late_submission_with_nothing_on_time_is_graded_with_the_penalty(hub):
    """A submission after the student's deadline (class.toml) with nothing handed in on time
    is the one that counts: graded, the late policy's penalty off (here all of it: beyond
    max_days), and the student told why."""
    (hub.course / "autograder" / "class.toml").write_text(
        f"[due]\n{SECTION} = 2026-01-01T00:00:00\n\n[late]\npenalty_per_day = 0.1\nmax_days = 7\n",
        encoding="utf-8",
    )
    user = LATE_ONLY
    work = Path(tempfile.mkdtemp(prefix="coursehub-late-", dir="/tmp"))
    os.chmod(work, 0o755)
    cases.CASES["honest-complete"].write(work / SECTION, cases.Context(hub.course, 9))
    subprocess.run(["chown", "-R", user, str(work)], check=True)
    done = as_user(
        user, str(ROOT / "coursehub" / "student_env" / "bin" / "python"), "-m", "nbgrader",
        "submit", SECTION, "--course=distopt", f"--Exchange.root={hub.state / 'exchange'}",
        cwd=work, timeout=300, env=dict(os.environ, HOME=str(work)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    def graded():
        mine = [e for e in ledger(hub).values() if e["student"] == user]
        return mine if mine and mine[0]["status"] == "graded" else None

    [entry] = poll(graded, timeout_s=RESULT_S, what="the late submission graded")
    assert entry["late"] and float(entry["score"]) == 0, entry
    stamp = entry["name"].split("+")[2]
    told = Path(pwd.getpwnam(user).pw_dir) / SECTION / "feedback" / stamp / "result.md"
    text = told.read_text()
    assert text.startswith(f"# {SECTION}: graded, 0.0 of {float(cases.MAX_SCORE)} points"), text
    assert "nothing before it was on time, so it counts" in text, text
    assert f"{float(cases.MAX_SCORE)} points before the late penalty" in text, text
    row = grades_row(hub, user)
    assert float(row["score"]) == 0 and row["late"], row
    shutil.rmtree(work, ignore_errors=True)


def grades_row(hub: Hub, user: str) -> dict[str, str]:
    """The user's row of grades.csv, once the service's class report has it (it builds the
    report once the submissions stop arriving: COURSEHUB_REPORT_S)."""

    def row():
        path = hub.course / "autograder" / "grades.csv"
        if not path.is_file():
            return None
        with path.open(newline="") as f:
            mine = (user, SECTION)
            return next(
                (r for r in csv.DictReader(f) if (r["student_id"], r["section"]) == mine), None
            )

    return poll(row, timeout_s=RESULT_S, what=f"{user}'s row in grades.csv")


DUE_IN_S = 150  # the deadline of the on-time-then-late test, from its start


def test_on_time_then_late_counts_the_same_on_both_paths(hub, tmp_path_factory):
    """One rule for which submission counts (coursehub/counted.py): a student submits on time,
    then (better answers) after the deadline. The grading service grades the first and keeps
    the second ungraded; the instructor's collect and the class run (make grade) count the same
    one with the same lateness, under the same class.toml: result.md, grades.csv and
    grades_lms.csv agree. Beside it, another student's Assignment List shows a graded, a
    waiting (rate limit) and a late submission: the screenshot of the closing note."""
    due = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=DUE_IN_S)
    (hub.course / "autograder" / "class.toml").write_text(
        f"[due]\n{SECTION} = {due.isoformat()}\n\n[late]\npenalty_per_day = 0.2\n",
        encoding="utf-8",
    )
    sessions = {user: hub.start_server(user) for user in (TWICE, LISTED)}
    released = nbformat.read(hub.course / "notebooks" / SECTION / f"{NOTEBOOK}.ipynb", 4)
    ids = fixtures.answer_ids(released)
    half = fixtures.answered_notebook(
        SECTION, NOTEBOOK, root=hub.course, unanswered=set(ids[len(ids) // 2 :])
    )
    full = fixtures.answered_notebook(SECTION, NOTEBOOK, root=hub.course)
    path = f"api/contents/{SECTION}/{NOTEBOOK}.ipynb"
    for s in sessions.values():
        fetched = s.post(
            f"{s.base}/assignments/fetch",
            json={"course_id": "distopt", "assignment_id": SECTION},
            timeout=120,
        )
        assert fetched.status_code == 200, fetched.text
        r = s.put(f"{s.base}/{path}", json={"type": "notebook", "content": half}, timeout=60)
        assert r.status_code == 200, r.text
    on_time = submit_through_lab(hub, TWICE, sessions[TWICE])
    first = submit_through_lab(hub, LISTED, sessions[LISTED])

    def result_of(user, stamp, state):
        def found():
            text = feedback_folders(sessions[user]).get(stamp, "")
            return text if text.startswith(f"# {SECTION}: {state}") else None

        return poll(found, timeout_s=RESULT_S, what=f"{user}'s {stamp}: {state}")

    on_time_md = result_of(TWICE, on_time, "graded, ")
    result_of(LISTED, first, "graded, ")
    waiting = submit_through_lab(hub, LISTED, sessions[LISTED])  # within the rate limit
    result_of(LISTED, waiting, "waiting, graded at ")
    assert dt.datetime.now(dt.UTC) < due, f"grading took longer than {DUE_IN_S} s on this machine"

    time.sleep(max(0.0, (due - dt.datetime.now(dt.UTC)).total_seconds()) + 1)
    r = sessions[TWICE].put(
        f"{sessions[TWICE].base}/{path}", json={"type": "notebook", "content": full}, timeout=60
    )
    assert r.status_code == 200, r.text
    late = submit_through_lab(hub, TWICE, sessions[TWICE])
    late_too = submit_through_lab(hub, LISTED, sessions[LISTED])
    late_md = result_of(TWICE, late, "late, not graded")
    result_of(LISTED, late_too, "late, not graded")

    # the Assignment List: each submission's time, then its state
    states = listed_states(sessions[LISTED])
    assert [line.split(": ", 1)[1].split(",")[0] for line in states] == [
        "graded", "waiting", "late"
    ], states  # fmt: skip
    shot = assignment_list_in_chromium(
        hub, LISTED, ["graded, ", "waiting, graded at", "late, not graded"],
        tmp_path_factory.mktemp("chromium-list"),
    )  # fmt: skip
    print(f"\nAssignment List of {LISTED}: {states}; screenshot {shot}")

    # path 1, the grading service: the on-time one graded and counted, the late one kept
    entries = {e["name"].split("+")[2]: e for e in ledger(hub).values() if e["student"] == TWICE}
    assert entries[on_time]["status"] == "graded" and not entries[on_time]["late"]
    assert entries[late]["status"] == "late", entries[late]
    score = round(float(entries[on_time]["score"]), 2)
    assert 0 < score < cases.MAX_SCORE
    assert on_time_md.startswith(f"# {SECTION}: graded, {score} of {float(cases.MAX_SCORE)}")
    assert "newest submission before the deadline" in on_time_md, on_time_md
    assert "on time, is the one that counts" in late_md and on_time in late_md, late_md
    print(f"{TWICE}'s result.md of {on_time}:\n{on_time_md}\nand of {late}:\n{late_md}")

    # path 2, the instructor: collect (the counted one, not nbgrader's newest), make grade
    env = dict(hub.env, PYTHONPATH=f"{hub.course}:{ROOT}")
    done = subprocess.run(
        [str(PYTHON), "-m", "coursehub.instructor", "collect", SECTION],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    collected = hub.course / "autograder" / "submitted" / TWICE / SECTION
    assert (collected / "timestamp.txt").read_text().strip() == on_time
    done = subprocess.run(
        [str(PYTHON), "-m", "autograder.grade", "--section", SECTION, "--student", TWICE],
        cwd=hub.course, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    row = grades_row(hub, TWICE)
    assert round(float(row["score"]), 2) == score and row["late"] == "", row
    handed_in = counted.nbgrader_time(on_time).isoformat(timespec="minutes")
    assert row["submitted_at"] == handed_in, (row, handed_in)
    with (hub.course / "autograder" / "grades_lms.csv").open(newline="") as f:
        lms = next(r for r in csv.DictReader(f) if TWICE in r.values())
    assert round(float(lms[SECTION]), 2) == score, lms
    for user in (TWICE, LISTED):
        hub.api("DELETE", f"/users/{user}/server")
