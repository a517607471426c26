"""Drive a JupyterLab page in headless Chromium (Selenium, system chromedriver).

The server is started with ``--LabApp.expose_app_in_browser=True`` so that the page has
``window.jupyterapp``: commands (run all, save) go through JupyterLab's own command registry,
which is what the Run menu calls, without depending on menu layout or key bindings.
What the student would see (prompts, the kernel indicator, dialogs) is read from the DOM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def start_chromium(user_data_dir: Path) -> webdriver.Chrome:
    """Headless Chromium with a fresh profile; no network calls of its own (updates, sync)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in containers/CI: the sandbox cannot start
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",  # small /dev/shm in containers crashes tabs
        f"--user-data-dir={user_data_dir}",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    # An explicit driver path: Selenium Manager then never tries to download a driver.
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(60)
    return driver


def poll(check, *, timeout_s: float, what: str, interval_s: float = 0.5):
    """Call ``check()`` until it returns something truthy; fail with ``what`` after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


# The notebook widget in the main area whose file is arguments[0], or null.
_PANEL_JS = """
const app = window.jupyterapp;
if (!app) return null;
const panel = app.shell.currentWidget;
if (!panel || !panel.context || panel.context.path !== arguments[0] || !panel.content) return null;
"""

# Kernel status and per-cell execution state, from the model (counts, outputs) and the DOM
# (the prompt the student sees: "[*]:" while a cell is queued or running).
_STATE_JS = (
    _PANEL_JS
    + """
const session = panel.sessionContext.session;
const kernel = session && session.kernel ? session.kernel.status : null;
const cells = panel.content.widgets.map((cell, index) => {
    if (cell.model.type !== 'code') return null;
    const prompt = cell.node.querySelector('.jp-InputPrompt');
    const errors = cell.model.outputs.toJSON()
        .filter(out => out.output_type === 'error')
        .map(out => ({ename: out.ename, evalue: out.evalue}));
    return {
        index: index,
        count: cell.model.executionCount,
        running: prompt ? prompt.textContent.includes('*') : false,
        errors: errors,
        source: cell.model.sharedModel.getSource().slice(0, 400),
    };
}).filter(c => c !== null);
return {kernel: kernel, cells: cells};
"""
)


@dataclass
class CellError:
    index: int
    ename: str
    evalue: str
    source: str

    def __str__(self) -> str:
        return f"cell {self.index}: {self.ename}: {self.evalue}\n--- cell source ---\n{self.source}"


class LabPage:
    """One notebook open in JupyterLab: open, run all, read the result, validate, screenshot."""

    def __init__(self, driver: webdriver.Chrome, base_url: str, path: str):
        self.driver, self.base_url, self.path = driver, base_url, path

    def open(self, *, timeout_s: float = 120) -> None:
        # "?reset" starts from an empty workspace, so notebooks of earlier tests do not reopen
        # (and start kernels) beside this one.
        self.driver.get(f"{self.base_url}/lab/tree/{self.path}?reset")
        poll(
            lambda: self.state() and self.state()["kernel"] == "idle",
            timeout_s=timeout_s,
            what=f"{self.path} to open with an idle kernel",
        )

    def state(self) -> dict | None:
        return self.driver.execute_script(_STATE_JS + "", self.path)

    def run_all(self, *, timeout_s: float = 240) -> dict:
        """Run > Run All Cells, then wait until the kernel is idle and no prompt shows [*]."""
        # Reference notebooks are stored executed: clear first, so that an execution count
        # can only come from this run (Edit > Clear Outputs of All Cells also clears counts).
        self.driver.execute_async_script(
            _PANEL_JS.replace("return null;", "{ arguments[1](false); return; }")
            + "app.commands.execute('notebook:clear-all-cell-outputs')"
            ".then(() => arguments[1](true));",
            self.path,
        )
        assert all(c["count"] is None for c in self.state()["cells"]), "outputs not cleared"
        return self._run_from(0, "notebook:run-all-cells", timeout_s=timeout_s)

    def run_all_past_errors(self, *, timeout_s: float = 240) -> dict:
        """Run all cells, then run each cell that the run skipped, one at a time, in order.

        JupyterLab stops a run at the first error: the kernel aborts the cells queued behind it
        (which of them depends on timing). A student notebook would stop at its first blank
        exercise, so each skipped cell is then run on its own (Run > Run Selected Cell), top to
        bottom, as a student who runs cell after cell does.
        """
        deadline = time.monotonic() + timeout_s
        state = self.run_all(timeout_s=timeout_s)
        while True:
            skipped = [i for i, c in enumerate(state["cells"]) if c["count"] is None]
            if not skipped:
                return state
            self.driver.execute_script(
                _PANEL_JS + "panel.content.activeCellIndex = arguments[1]; return true;",
                self.path,
                state["cells"][skipped[0]]["index"],
            )
            state = self._run_from(
                skipped[0], "notebook:run-cell", timeout_s=deadline - time.monotonic()
            )

    def _run_from(self, start: int, command: str, *, timeout_s: float) -> dict:
        """Execute ``command``; wait until code cell ``start`` has run and the run is over."""
        self.driver.execute_script(
            _PANEL_JS + "app.commands.execute(arguments[1]); return true;", self.path, command
        )

        def finished():
            state = self.state()
            if state is None or state["kernel"] != "idle":
                return None
            if any(c["running"] for c in state["cells"]):
                return None
            # Idle with no [*] also holds for an instant before the first cell is sent;
            # the start cell's execution count shows that the run has really happened.
            if state["cells"][start]["count"] is None:
                return None
            return state

        # Two consecutive finished polls: the kernel may go idle for a moment between cells.
        poll(finished, timeout_s=timeout_s, what=f"{self.path} to finish running")
        time.sleep(0.5)
        return poll(finished, timeout_s=timeout_s, what=f"{self.path} to finish running")

    @staticmethod
    def errors(state: dict) -> list[CellError]:
        return [
            CellError(c["index"], e["ename"], e["evalue"], c["source"])
            for c in state["cells"]
            for e in c["errors"]
        ]

    def save(self) -> None:
        """Save, so that leaving the page raises no "unsaved changes" prompt."""
        self.driver.execute_async_script(
            _PANEL_JS.replace("return null;", "{ arguments[1](false); return; }")
            + "app.commands.execute('docmanager:save').then(() => arguments[1](true),"
            " () => arguments[1](false));",
            self.path,
        )

    def screenshot(self, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(target))

    def validate(self, *, timeout_s: float = 240) -> str:
        """Click nbgrader's Validate toolbar button; return the result dialog's text."""
        # The extension gives its toolbar item the class "validate-button" (label "Validate").
        button = poll(
            lambda: self.driver.find_elements(By.CSS_SELECTOR, ".jp-Toolbar .validate-button"),
            timeout_s=30,
            what="nbgrader's Validate button in the notebook toolbar",
        )[0]
        button.click()
        # The dialog's title is "Validation Results" (or "Validation failed" on a server error).
        dialog = poll(
            lambda: [
                d
                for d in self.driver.find_elements(By.CSS_SELECTOR, ".jp-Dialog")
                if "Validation" in d.find_element(By.CSS_SELECTOR, ".jp-Dialog-header").text
            ],
            timeout_s=timeout_s,
            what="nbgrader's validation dialog",
        )[0]
        text = dialog.find_element(By.CSS_SELECTOR, ".jp-Dialog-body").get_attribute("textContent")
        dialog.find_element(By.CSS_SELECTOR, ".jp-Dialog-button.jp-mod-accept").click()
        return text


class ExplorerPanel:
    """One explorer (distopt.explore.Panel) in a notebook's output, driven as a student would.

    The panel's pieces carry the CSS classes Panel gives them: ``distopt-explorer-<name>``
    around it all, ``distopt-control-<key>`` per control, ``distopt-draw``, ``distopt-readout``
    (a ``<pre>`` of the printed lines) and ``distopt-figure`` (the figure's ``<img>``).
    """

    def __init__(self, driver: webdriver.Chrome, name: str):
        self.driver, self.name = driver, name
        self.css = f".distopt-explorer-{name}"
        poll(
            lambda: driver.find_elements(By.CSS_SELECTOR, self.css),
            timeout_s=60,
            what=f"the {name} explorer to render",
        )
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", self.root)

    @property
    def root(self):
        """Found again at each use: JupyterLab may re-render an output (stale elements)."""
        return self.driver.find_element(By.CSS_SELECTOR, self.css)

    def _one(self, css: str):
        return self.root.find_element(By.CSS_SELECTOR, css)

    def _text(self, css: str) -> str:
        """The text of the first element matching ``css`` in the panel, read in the page."""
        return self.driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';",
            f"{self.css} {css}",
        )

    def readout(self) -> str:
        return self._text(".distopt-readout pre")

    def note(self) -> str:
        return self._text(".distopt-note")

    def figure(self) -> str | None:
        """The figure's image data (its ``src``), or None before the first draw."""
        return self.driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.src : null;",
            f"{self.css} .distopt-figure img",
        )

    def draw(self) -> None:
        self._one(".distopt-draw").click()

    def move(self, key: str, label: str) -> None:
        """Set control ``key`` to the option labelled ``label`` (a drop-down or toggle buttons),
        or type ``label`` into it (a number field), as a student would."""
        control = self._one(f".distopt-control-{key}")
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", control)
        selects = control.find_elements(By.TAG_NAME, "select")
        buttons = [b for b in control.find_elements(By.TAG_NAME, "button") if b.text == label]
        inputs = control.find_elements(By.TAG_NAME, "input")
        if selects:
            Select(selects[0]).select_by_visible_text(label)
        elif buttons:
            buttons[0].click()
        elif inputs:
            inputs[0].send_keys(Keys.CONTROL, "a")  # select what is there, then type over it
            inputs[0].send_keys(label, Keys.ENTER)
        else:
            raise AssertionError(f"control {key} of the {self.name} explorer has no input")

    def wait_for(self, text: str, *, other_than: str | None = None, timeout_s: float = 60) -> str:
        """Wait until the readout shows ``text`` and a figure other than ``other_than`` is
        drawn (the readout and the figure update one after the other); return the figure."""

        def shown():
            figure = self.figure()
            return self.readout() == text and figure and figure != other_than and figure

        return poll(
            shown,
            timeout_s=timeout_s,
            what=f"the {self.name} explorer to show:\n{text}\nand a new figure",
        )

    def screenshot(self, target: Path) -> None:
        """The page with the panel's note, readout and figure in view (below its controls)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        self.driver.execute_script(
            "arguments[0].scrollIntoView({block: 'start'});", self._one(".distopt-note")
        )
        self.driver.save_screenshot(str(target))
