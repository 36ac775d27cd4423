"""The course as a learner meets it: every notebook opened in JupyterLab, in a real browser.

A JupyterLab server started here (127.0.0.1, a free port, a token, autosave off, its own
settings, workspaces, runtime, config and data folders in a temporary folder) serves the course's
``notebooks/``; Chromium, driven by Playwright, opens each notebook in a fresh workspace and:

* ``test_opening_leaves_the_notebook_unmodified``: opening it (the kernel starts) must not mark it
  modified (JupyterLab rewrites a kernelspec other than the installed one), saving it (as
  RISE's Alt+R does before showing the deck, and File > Save) must write the committed bytes again
  (``course_lib.classroom.notebook_format``; the file is put back if not), and each explorer,
  which shows as ``interactive(children=...)`` text until the notebook runs (saved widget state of
  an untrusted notebook never renders), has a static figure in the code cell just above it;
* ``test_restart_and_run_all``: Kernel > Restart Kernel and Run All, then: no error and no stderr
  output in any cell (widget outputs included), every explorer (an ``interact`` cell) renders as
  widgets, moving each of its controls (sliders, dropdowns, text boxes) changes the figure below
  it (screenshots of every state are kept), and the files of ``notebooks/`` and ``figures/`` are unchanged.

The kernels run with a learner's environment: the test run's ``COURSE_OUTPUT_DIR``,
``COURSE_SOLUTIONS`` and ``TQDM_DISABLE`` are removed, so exercise cells check the learner's
unsolved versions and figures go where a learner's go (``TMPDIR`` points into the test's folder).

Needs a Chromium executable (``chromium`` or ``chromium-browser`` on PATH, or ``COURSE_CHROMIUM``)
and the ``playwright`` package; never ``playwright install``, which downloads another browser.
Without them the tests skip, unless ``COURSE_BROWSER_REQUIRED=1`` (set by ``.ci/run`` in CI),
where they fail. Environment variables:

* ``COURSE_BROWSER_ARTIFACTS``: where screenshots and logs go (default: a new temporary folder;
  the path is printed);
* ``COURSE_BROWSER_ROOT``: the checkout whose ``notebooks/`` and ``figures/`` are tested
  (default: this repository);
* ``COURSE_BROWSER_TIMEOUT``: seconds allowed for one notebook's Run All (default 300).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
COURSE_ROOT = Path(os.environ.get("COURSE_BROWSER_ROOT") or REPO_ROOT).resolve()
NOTEBOOKS = sorted((COURSE_ROOT / "notebooks").glob("*.ipynb"))
RUN_TIMEOUT_S = float(os.environ.get("COURSE_BROWSER_TIMEOUT") or 300)
WIDGET_TIMEOUT_MS = 60_000
CHECKED_FOLDERS = ("notebooks", "figures")
# Variables of the test run that a learner's kernel does not have.
TEST_ONLY_VARIABLES = ("COURSE_OUTPUT_DIR", "COURSE_SOLUTIONS", "TQDM_DISABLE")
# Headless Chromium as root in a container: no sandbox, no GPU, no network of its own.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
EXPLORER_CALL = re.compile(r"\binteract(?:ive)?\s*\(")
STDERR_MIME = "application/vnd.jupyter.stderr"  # JupyterLab renders stderr and tracebacks so


def find_chromium() -> str | None:
    explicit = os.environ.get("COURSE_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _missing_requirement() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return (
            "the playwright package is not installed (`python -m pip install playwright`; "
            "never `playwright install`: the test drives the system's Chromium)"
        )
    if find_chromium() is None:
        return (
            "no Chromium executable found (`chromium` or `chromium-browser` on PATH, or "
            "COURSE_CHROMIUM; on Debian/Ubuntu: `apt-get install chromium`)"
        )
    return None


_MISSING = _missing_requirement()
_REQUIRED = os.environ.get("COURSE_BROWSER_REQUIRED") == "1"
if _MISSING is not None and not _REQUIRED:
    pytest.skip(f"browser test skipped: {_MISSING}", allow_module_level=True)

# --------------------------------------------------------------------------------------------
# JavaScript run in the page. `window.jupyterapp` is exposed by --LabApp.expose_app_in_browser.

_PANEL = """
const app = window.jupyterapp;
const panel = app && app.shell
    ? Array.from(app.shell.widgets('main')).find(w => w.context && w.context.path === path)
    : undefined;
"""

_JS_READY = (
    "(path) => {"
    + _PANEL
    + """
    if (!panel || !panel.context.isReady || !panel.sessionContext.session) return false;
    const kernel = panel.sessionContext.session.kernel;
    return !!kernel && kernel.status === 'idle' && kernel.connectionStatus === 'connected';
}"""
)

_JS_OPEN_STATE = (
    "async (path) => {"
    + _PANEL
    + """
    // JupyterLab writes the running kernel's spec into the metadata once it knows it: wait
    // for that (at most 10 s), then a moment for the modified flag to follow.
    const spec = await panel.sessionContext.session.kernel.spec;
    const written = () => (panel.context.model.getMetadata('kernelspec') || {}).display_name;
    for (let waited = 0; written() !== spec.display_name && waited < 10000; waited += 100) {
        await new Promise(resolve => setTimeout(resolve, 100));
    }
    await new Promise(resolve => setTimeout(resolve, 500));
    return {dirty: panel.context.model.dirty,
            kernelspec: panel.context.model.getMetadata('kernelspec') || null};
}"""
)

# Saves the notebook as jupyterlab-rise does before it shows the deck (its commands call
# `context.save()`; File > Save does the same, then makes a checkpoint).
_JS_SAVE = (
    "async (path) => {"
    + _PANEL
    + """
    await panel.context.save();
    return panel.context.model.dirty;
}"""
)

# Tags every cell's node with its index (for locators) and returns the cells as nbformat JSON.
_JS_CELLS = (
    "(path) => {"
    + _PANEL
    + """
    return panel.content.widgets.map((cell, index) => {
        cell.node.setAttribute('data-course-cell', String(index));
        const json = cell.model.toJSON();
        const source = Array.isArray(json.source) ? json.source.join('') : json.source;
        return {index, cell_type: json.cell_type, source,
                execution_count: json.cell_type === 'code' ? cell.model.executionCount : null,
                outputs: json.outputs || []};
    });
}"""
)

_JS_PROGRESS = (
    "(path) => {"
    + _PANEL
    + """
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    let pending = 0, errors = 0;
    for (const cell of panel.content.widgets) {
        if (cell.model.type !== 'code') continue;
        const json = cell.model.toJSON();
        const source = Array.isArray(json.source) ? json.source.join('') : json.source;
        if (source.trim() && cell.model.executionCount === null) pending += 1;
        errors += (json.outputs || []).filter(o => o.output_type === 'error').length;
    }
    return {status: kernel ? kernel.status : 'none', pending, errors};
}"""
)

# The figures an explorer's output shows: their sources, and whether all of them are decoded.
_JS_FIGURES = """(output) => {
    const images = Array.from(output.querySelectorAll('img'));
    return {sources: images.map(img => img.src),
            loaded: images.every(img => img.complete && img.naturalWidth > 0)};
}"""

_JS_FIGURES_CHANGED = """([output, before]) => {
    const now = Array.from(output.querySelectorAll('img')).map(img => img.src);
    return now.length > 0 && JSON.stringify(now) !== JSON.stringify(before);
}"""

# A slider's value as the page shows it: the handle's ARIA value and the readout.
_JS_SLIDER_VALUE = """(node) => {
    const handle = node.querySelector('.noUi-handle');
    const readout = node.querySelector('.widget-readout');
    return `${handle ? handle.getAttribute('aria-valuenow') : ''}|${readout ? readout.innerText : ''}`;
}"""

_JS_KERNEL_STATUS = (
    "(path) => {"
    + _PANEL
    + """
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    return kernel ? kernel.status : 'none';
}"""
)

_JS_STDERR_TEXTS = f"""(root) => Array.from(root.querySelectorAll('[data-mime-type="{STDERR_MIME}"]'))
    .map(node => node.innerText)"""


# --------------------------------------------------------------------------------------------
# Fixtures: artefacts folder, JupyterLab server, browser.


@pytest.fixture(scope="module")
def artifacts(request) -> Path:
    configured = os.environ.get("COURSE_BROWSER_ARTIFACTS")
    path = Path(configured) if configured else Path(tempfile.mkdtemp(prefix="course-browser-"))
    path.mkdir(parents=True, exist_ok=True)
    message = f"browser test: screenshots and logs in {path}"
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(f"\n{message}")
    else:
        print(message)
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


class LabServer:
    def __init__(self, base_url: str, token: str, process: subprocess.Popen, log: Path):
        self.base_url, self.token, self.process, self.log = base_url, token, process, log

    def api(self, method: str, path: str):
        request = urllib.request.Request(
            f"{self.base_url}{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def notebook_url(self, name: str) -> str:
        workspace = f"t{uuid.uuid4().hex}"
        return (
            f"{self.base_url}/lab/workspaces/{workspace}/tree/{urllib.parse.quote(name)}"
            f"?reset&token={self.token}"
        )

    def shut_down_sessions(self, name: str) -> None:
        """Stop the kernels of `name` (two cores: the next notebook needs them)."""
        if self.process.poll() is not None:
            return  # the server is gone, and the test says so
        for session in self.api("GET", "/api/sessions"):
            if session.get("path") == name:
                self.api("DELETE", f"/api/sessions/{session['id']}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@pytest.fixture(scope="module")
def lab(tmp_path_factory, artifacts) -> Iterator[LabServer]:
    home = tmp_path_factory.mktemp("jupyterlab")
    settings = home / "settings"
    _write_json(
        settings / "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings",
        {"autosave": False},
    )
    _write_json(
        settings / "@jupyterlab/apputils-extension/notification.jupyterlab-settings",
        {"fetchNews": "false", "checkForUpdates": False},
    )
    env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_VARIABLES}
    folders = {
        "JUPYTERLAB_SETTINGS_DIR": settings,
        "JUPYTERLAB_WORKSPACES_DIR": home / "workspaces",
        "JUPYTER_RUNTIME_DIR": home / "runtime",
        "JUPYTER_CONFIG_DIR": home / "config",
        "JUPYTER_DATA_DIR": home / "data",
        "IPYTHONDIR": home / "ipython",
        "TMPDIR": home / "tmp",
    }
    for name, folder in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        env[name] = str(folder)
    # Matplotlib says on stderr that it builds its font cache the first time it is imported on a
    # machine: let that happen here rather than inside the first notebook.
    subprocess.run(
        [sys.executable, "-c", "import matplotlib.pyplot"], env=env, check=True, timeout=300
    )

    port, token = _free_port(), uuid.uuid4().hex
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
        f"--ServerApp.root_dir={COURSE_ROOT / 'notebooks'}",
        f"--IdentityProvider.token={token}",
        "--LabApp.news_url=None",
        "--LabApp.expose_app_in_browser=True",
    ]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    log = home / "server.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            command, cwd=COURSE_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    server = LabServer(f"http://127.0.0.1:{port}", token, process, log)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"JupyterLab exited with {process.returncode}:\n{server.log_tail()}")
            try:
                server.api("GET", "/api/status")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer within 120 s:\n{server.log_tail()}")
                time.sleep(0.5)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        shutil.copy(log, artifacts / "jupyterlab-server.log")


@pytest.fixture(scope="module")
def browser():
    if _MISSING is not None:  # and required: every browser test fails, the others still run
        pytest.fail(f"COURSE_BROWSER_REQUIRED=1 but {_MISSING}", pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=find_chromium(), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


# --------------------------------------------------------------------------------------------
# Helpers.


def checkout_state(root: Path) -> dict:
    """`git status --porcelain` of the checked folders and a hash of every file in them that
    git does not ignore (a second change to an already modified file shows only in the hash)."""
    folders = [f for f in CHECKED_FOLDERS if (root / f).exists()]
    git = ["git", "-C", str(root)]
    inside = subprocess.run([*git, "rev-parse"], capture_output=True).returncode == 0
    if inside:
        status = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=all", "--", *folders],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        listed = subprocess.run(
            [*git, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *folders],
            capture_output=True, text=True, check=True,
        ).stdout.split("\0")  # fmt: skip
        files = sorted({p for p in listed if p and (root / p).is_file()})
    else:
        status = None
        files = sorted(
            str(p.relative_to(root))
            for f in folders
            for p in (root / f).rglob("*")
            if p.is_file() and ".ipynb_checkpoints" not in p.parts  # JupyterLab's, as git ignores
        )
    hashes = {p: hashlib.sha256((root / p).read_bytes()).hexdigest() for p in files}
    return {"status": status, "hashes": hashes}


def describe_checkout_change(before: dict, after: dict) -> str:
    lines = []
    if before["status"] != after["status"]:
        lines.append(f"git status before:\n{before['status']}git status after:\n{after['status']}")
    old, new = before["hashes"], after["hashes"]
    lines += [f"  changed: {p}" for p in sorted(old.keys() & new.keys()) if old[p] != new[p]]
    lines += [f"  added: {p}" for p in sorted(new.keys() - old.keys())]
    lines += [f"  removed: {p}" for p in sorted(old.keys() - new.keys())]
    return "\n".join(lines)


def _first_line(source: str) -> str:
    lines = [line for line in source.splitlines() if line.strip()]
    return lines[0][:80] if lines else ""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:40] or "control"


def open_notebook(browser, lab: LabServer, notebook: Path, log: list[str]):
    """A new browser context showing `notebook` in a fresh workspace, its kernel idle."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(WIDGET_TIMEOUT_MS)
    page = context.new_page()
    page.on("console", lambda message: log.append(f"console.{message.type}: {message.text}"))
    page.on("pageerror", lambda error: log.append(f"page error: {error}"))
    page.goto(lab.notebook_url(notebook.name))
    page.wait_for_function(_JS_READY, arg=notebook.name, timeout=180_000, polling=500)
    return context, page


def saving_problems(page, notebook: Path) -> list[str]:
    """Save the open `notebook` from JupyterLab and compare the file with what was there; the
    committed bytes are put back whatever happens."""
    committed = notebook.read_bytes()
    try:
        dirty = page.evaluate(_JS_SAVE, notebook.name)
        saved = notebook.read_bytes()
    finally:
        if notebook.read_bytes() != committed:
            notebook.write_bytes(committed)
    problems = ["still marked modified after saving"] if dirty else []
    if saved != committed:
        diff = difflib.unified_diff(
            committed.decode("utf-8", "replace").splitlines(),
            saved.decode("utf-8", "replace").splitlines(),
            "committed", "saved by JupyterLab", lineterm="",
        )  # fmt: skip
        problems.append(
            "saving it in JupyterLab (as opening its deck does) rewrites the file, so a "
            "teacher's checkout is modified (`python -m course_lib.classroom.notebook_format "
            f"notebooks/{notebook.name}` rewrites it as course_lib saves notebooks; a difference "
            "it leaves is one course_lib.classroom.notebook_format does not know):\n"
            + "\n".join(list(diff)[:30])
        )
    return problems


def explorer_cells(cells: list[dict]) -> list[dict]:
    return [c for c in cells if c["cell_type"] == "code" and EXPLORER_CALL.search(c["source"])]


def wait_for_run_all(page, name: str) -> dict:
    """Poll until the kernel is idle and every non-empty code cell has run, or an error stopped
    the run (the cells after it are aborted); two polls in a row must agree."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    finished_once = False
    while True:
        progress = page.evaluate(_JS_PROGRESS, name)
        finished = progress["status"] == "idle" and (
            progress["pending"] == 0 or progress["errors"] > 0
        )
        if finished and finished_once:
            return progress
        finished_once = finished
        if progress["status"] in ("dead", "autorestarting"):
            raise AssertionError(f"the kernel died during Run All: {progress}")
        if time.monotonic() > deadline:
            raise AssertionError(f"Run All did not finish within {RUN_TIMEOUT_S:.0f} s: {progress}")
        time.sleep(1.0)


def settled_figures(page, name: str, output) -> list[str]:
    """The explorer's figures once the kernel is idle (every callback has run) and they are
    decoded and unchanged over two polls half a second apart."""
    deadline = time.monotonic() + WIDGET_TIMEOUT_MS / 1000
    previous = None
    while True:
        figures = output.evaluate(_JS_FIGURES)
        idle = page.evaluate(_JS_KERNEL_STATUS, name) == "idle"
        if idle and figures["loaded"] and figures["sources"] and figures == previous:
            return figures["sources"]
        previous = figures if idle else None
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the explorer's figure did not settle within {WIDGET_TIMEOUT_MS / 1000:.0f} s "
                f"(kernel idle: {idle}, figures: {len(figures['sources'])}, "
                f"decoded: {figures['loaded']})"
            )
        time.sleep(0.5)


def output_problems(cells: list[dict]) -> list[str]:
    problems = []
    for cell in cells:
        for output in cell["outputs"]:
            where = f"cell {cell['index']} ({_first_line(cell['source'])!r})"
            if output["output_type"] == "error":
                problems.append(f"{where}: error {output.get('ename')}: {output.get('evalue')}")
            elif output["output_type"] == "stream" and output.get("name") == "stderr":
                text = output.get("text")
                text = "".join(text) if isinstance(text, list) else text
                problems.append(f"{where}: stderr: {text.strip()[:500]}")
    return problems


def move_control(page, control) -> str:
    """Move one slider (drag its handle), dropdown (pick another option), text box (type more)
    or checkbox (toggle it); returns its label."""
    label_node = control.locator(".widget-label")
    label = label_node.first.inner_text().strip() if label_node.count() else ""
    select = control.locator("select")
    if select.count():
        options = select.first.locator("option").all_inner_texts()
        assert len(options) > 1, f"dropdown {label!r} has a single option"
        current = select.first.evaluate("node => node.selectedIndex")
        select.first.select_option(index=(current + 1) % len(options))
        return label or "dropdown"
    handle = control.locator(".noUi-handle")
    if handle.count():
        value_before = control.evaluate(_JS_SLIDER_VALUE)
        handle.first.scroll_into_view_if_needed()
        track = control.locator(".noUi-target").first.bounding_box()
        box = handle.first.bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        fraction = (x - track["x"]) / track["width"]
        target = track["x"] + track["width"] * (
            fraction + 0.3 if fraction < 0.5 else fraction - 0.3
        )
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.move(target, y)  # one move: one new value, one callback
        page.mouse.up()
        try:
            page.wait_for_function(
                f"([node, before]) => ({_JS_SLIDER_VALUE})(node) !== before",
                arg=[control.element_handle(), value_before],
                timeout=10_000,
            )
        except Exception as error:
            raise AssertionError(f"dragging slider {label!r} did not move it") from error
        return label or "slider"
    text = control.locator("input[type=text], textarea")
    if text.count():
        before = text.first.input_value()
        text.first.fill(f"{before} and then some more words")  # one edit: one new value
        text.first.press("Enter")
        return label or "text"
    checkbox = control.locator("input[type=checkbox]")
    if checkbox.count():
        checkbox.first.click()
        return label or "checkbox"
    raise AssertionError(
        f"explorer control {label!r} is not a slider, dropdown, text box or checkbox, which this "
        f"test moves: classes {control.get_attribute('class')!r}"
    )


def check_explorer(page, name: str, explorer: dict, prefix: Path) -> None:
    """The explorer cell shows widgets and a figure; moving each control changes the figure.
    Screenshots: `<prefix>-initial.png`, then `<prefix>-<control>.png` after each move."""
    where = f"{name} explorer cell {explorer['index']} ({_first_line(explorer['source'])!r})"
    cell = page.locator(f'[data-course-cell="{explorer["index"]}"]')
    box = cell.locator(".widget-interact").first
    try:
        box.wait_for(state="attached", timeout=WIDGET_TIMEOUT_MS)
    except Exception as error:
        text = cell.locator(".jp-OutputArea").first.inner_text()
        raise AssertionError(
            f"{where}: no widgets rendered; the output shows: {text.strip()[:300]!r}"
        ) from error
    box.scroll_into_view_if_needed()
    output = box.locator(".widget-output").first
    output.wait_for(state="attached")
    try:
        settled_figures(page, name, output)
    except AssertionError as error:
        raise AssertionError(f"{where}: no figure below the controls: {error}") from None
    box.screenshot(path=f"{prefix}-initial.png")
    controls = box.locator(":scope > .widget-inline-hbox")
    assert controls.count() > 0, f"{where}: no controls"
    for position in range(controls.count()):
        figures = settled_figures(page, name, output)
        label = move_control(page, controls.nth(position))
        try:
            page.wait_for_function(
                _JS_FIGURES_CHANGED,
                arg=[output.element_handle(), figures],
                timeout=WIDGET_TIMEOUT_MS,
            )
        except Exception as error:
            box.screenshot(path=f"{prefix}-{_slug(label)}-unchanged.png")
            raise AssertionError(f"{where}: moving {label!r} did not change the figure") from error
        settled_figures(page, name, output)
        box.screenshot(path=f"{prefix}-{_slug(label)}.png")
        stderr = page.evaluate(_JS_STDERR_TEXTS, box.element_handle())
        assert not stderr, f"{where}: after moving {label!r}: {stderr}"


# --------------------------------------------------------------------------------------------
# Tests.

notebook_params = pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[nb.stem for nb in NOTEBOOKS])


@notebook_params
def test_opening_leaves_the_notebook_unmodified(notebook, browser, lab, artifacts):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    log: list[str] = []
    context, page = open_notebook(browser, lab, notebook, log)
    try:
        state = page.evaluate(_JS_OPEN_STATE, notebook.name)
        cells = page.evaluate(_JS_CELLS, notebook.name)
        problems = []
        if state["dirty"]:
            saved = json.loads(notebook.read_text()).get("metadata", {}).get("kernelspec")
            problems.append(
                "opening the notebook marks it modified (a learner is asked to save a notebook "
                f"they have not touched); kernelspec saved: {saved}, after opening: "
                f"{state['kernelspec']}"
            )
        for explorer in explorer_cells(cells):
            above = [c for c in cells[: explorer["index"]] if c["cell_type"] == "code"]
            figures = 0
            if above:
                holder = page.locator(f'[data-course-cell="{above[-1]["index"]}"]')
                # a long notebook renders only the cells in view: bring the figure's cell there
                holder.scroll_into_view_if_needed()
                images = holder.locator(".jp-OutputArea img")
                try:
                    images.first.wait_for(state="attached", timeout=5000)
                except PlaywrightTimeout:  # no image came: counted as none below
                    pass
                figures = images.count()
            if not figures:
                problems.append(
                    f"explorer cell {explorer['index']} ({_first_line(explorer['source'])!r}): "
                    "no static figure in the code cell just above it, so a notebook opened "
                    "without running shows only the widget's text fallback there"
                )
        problems += saving_problems(page, notebook)
        assert not problems, f"{notebook.name}:\n" + "\n".join(problems)
    finally:
        (artifacts / notebook.stem).mkdir(exist_ok=True)
        (artifacts / notebook.stem / "open-console.log").write_text("\n".join(log))
        context.close()
        lab.shut_down_sessions(notebook.name)


@notebook_params
def test_restart_and_run_all(notebook, browser, lab, artifacts):
    folder = artifacts / notebook.stem
    folder.mkdir(exist_ok=True)
    before = checkout_state(COURSE_ROOT)
    log: list[str] = []
    started = time.monotonic()
    context, page = open_notebook(browser, lab, notebook, log)
    try:
        # Fresh prompts, so that "every cell has run" is visible; Run All replaces outputs anyway.
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
        # The Kernel menu's command; not awaited, it waits on the confirmation dialog.
        page.evaluate(
            "() => { window.jupyterapp.commands.execute('runmenu:restart-and-run-all'); }"
        )
        page.locator(".jp-Dialog .jp-mod-accept").click()
        progress = wait_for_run_all(page, notebook.name)
        seconds = time.monotonic() - started
        cells = page.evaluate(_JS_CELLS, notebook.name)
        (folder / "outputs.json").write_text(json.dumps(cells, indent=1)[:2_000_000])
        problems = output_problems(cells)
        if problems:  # show the first of them in failure.png
            first = next(c for c in cells if output_problems([c]))
            page.locator(f'[data-course-cell="{first["index"]}"]').scroll_into_view_if_needed()
        assert not problems and progress["pending"] == 0, (
            f"{notebook.name}: Run All: {progress}\n" + "\n".join(problems)
        )

        explorers = explorer_cells(cells)
        assert explorers, (
            f"{notebook.name} has no explorer (an `interact` cell): every notebook has one "
            "(CONTRIBUTING.md)"
        )
        for number, explorer in enumerate(explorers, start=1):
            check_explorer(page, notebook.name, explorer, folder / f"explorer{number}")

        stderr = page.evaluate(
            _JS_STDERR_TEXTS, page.locator(".jp-NotebookPanel").first.element_handle()
        )
        assert not stderr, f"{notebook.name}: error or stderr output shown: {stderr}"
        print(f"{notebook.name}: opened and run in {seconds:.0f} s, {len(explorers)} explorer(s)")
    except BaseException:
        page.screenshot(path=folder / "failure.png")
        raise
    finally:
        (folder / "run-console.log").write_text("\n".join(log))
        context.close()
        lab.shut_down_sessions(notebook.name)
    after = checkout_state(COURSE_ROOT)
    if after != before:
        pytest.fail(
            f"{notebook.name}: the run changed the checkout:\n"
            + describe_checkout_change(before, after)
        )


# --------------------------------------------------------------------------------------------
# Slides: one notebook per family of the course, presented as a deck by jupyterlab-rise (its
# /rise/ page on the same server), stepped through, then run from the top to its explorer.

# The course map's families (README); each deck is stepped through and its explorer moved.
RISE_DECKS = {
    "foundations": "00_permutation_invariance.ipynb",
    "rotations": "03_rope.ipynb",
    "score biases": "06_score_biases.ipynb",
    "the comparison": "10_bert_comparison.ipynb",
}
# Console errors of jupyterlab-rise's own slide page (0.43.1, its newest release) that nothing
# the course sets removes, each logged as "console.error: <text> (<file>)". Its bundle provides
# @jupyter/web-components 0.16.7 and also requires ~0.13.3 (it warns "Unsatisfied version"), so
# both load and the design tokens of their FAST library recurse in one of its own chunks; and it
# links `rise.css` and `<notebook>.css` beside every notebook, optional deck styles the course
# does not have (the server answers 404 with an HTML page). Any other error on a deck, or these
# from anywhere else, fails the deck test.
RISE_UPSTREAM_ERRORS = (
    re.compile(
        r"console\.error: RangeError: Maximum call stack size exceeded \(rise/\d+\.bundle\.js\)"
    ),
    re.compile(
        r"console\.error: Refused to apply style from '\S+/files/[^/']+\.css' because its MIME "
        r"type \('text/html'\) is not a supported stylesheet MIME type.* \(rise/[^/()]+\.ipynb\)"
    ),
)


def _console_line(message) -> str:
    """One log line of a console message; an error names the file or page it came from (the
    last two parts of its URL: ``rise/4437.bundle.js``, ``rise/03_rope.ipynb``)."""
    line = f"console.{message.type}: {message.text}"
    if message.type == "error":
        url = (message.location or {}).get("url", "")
        path = url.split("#")[0].split("?")[0]
        line += f" ({'/'.join(path.split('/')[-2:])})"
    return line


# Where the deck is: (top-level slide, sub-slide, visible fragments).
_JS_DECK_POSITION = """() => {
    const tops = Array.from(document.querySelectorAll('.reveal .slides > section'));
    const h = tops.findIndex(s => s.classList.contains('present'));
    const subs = h >= 0 ? Array.from(tops[h].querySelectorAll(':scope > section')) : [];
    return [h, subs.findIndex(s => s.classList.contains('present')),
            document.querySelectorAll('.reveal .fragment.visible').length];
}"""

_JS_DECK_SHAPE = """() => {
    const tops = Array.from(document.querySelectorAll('.reveal .slides > section'));
    return {slides: tops.length,
            vertical: tops.reduce((n, s) => n + s.querySelectorAll(':scope > section').length, 0),
            fragments: document.querySelectorAll('.reveal .slides .fragment').length,
            notes: document.querySelectorAll('.reveal .slides aside.notes .jp-Cell').length};
}"""

# The present slide shows something: one of its cells, with text, lies in the viewport.
_JS_PRESENT_RENDERED = """() => {
    const tops = Array.from(document.querySelectorAll('.reveal .slides > section'));
    const top = tops.find(s => s.classList.contains('present'));
    const sub = top && Array.from(top.querySelectorAll(':scope > section'))
        .find(s => s.classList.contains('present'));
    const cells = Array.from((sub || top || document).querySelectorAll('.jp-Cell'))
        .filter(c => !c.closest('aside.notes'));
    const inView = r => r.height > 10 && r.bottom > 0 && r.top < innerHeight && r.right > 0
        && r.left < innerWidth;
    return cells.some(c => inView(c.getBoundingClientRect()) && c.innerText.trim().length > 0);
}"""


def _deck_plan(notebook: Path) -> tuple[dict, list[str]]:
    from course_lib.classroom import slides

    nb = json.loads(notebook.read_text())
    spec = slides.load_spec(notebook.parent / "slides.yaml")
    return nb, slides.planned_types(nb, spec.get(notebook.stem, {}), notebook.stem)


def settled_explorer_figures(output) -> list[str]:
    """The explorer's figures once decoded and unchanged over two polls 0.5 s apart (the RISE
    page exposes no kernel status to wait on)."""
    deadline = time.monotonic() + WIDGET_TIMEOUT_MS / 1000
    previous = None
    while True:
        figures = output.evaluate(_JS_FIGURES)
        if figures["loaded"] and figures["sources"] and figures == previous:
            return figures["sources"]
        previous = figures
        if time.monotonic() > deadline:
            raise AssertionError(f"the explorer's figure did not settle: {figures}")
        time.sleep(0.5)


@pytest.mark.parametrize("family", list(RISE_DECKS), ids=[n[:2] for n in RISE_DECKS.values()])
def test_rise_deck_steps_through_its_slides_and_its_explorer_updates(
    family, browser, lab, artifacts
):
    name = RISE_DECKS[family]
    notebook = COURSE_ROOT / "notebooks" / name
    nb, types = _deck_plan(notebook)
    folder = artifacts / f"rise-{notebook.stem}"
    folder.mkdir(exist_ok=True)
    before = checkout_state(COURSE_ROOT)
    log: list[str] = []
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(WIDGET_TIMEOUT_MS)
    page = context.new_page()
    page.on("console", lambda message: log.append(_console_line(message)))
    page.on("pageerror", lambda error: log.append(f"page error: {error}"))
    try:
        page.goto(f"{lab.base_url}/rise/{urllib.parse.quote(name)}?token={lab.token}")
        page.wait_for_selector(".reveal.ready", timeout=180_000)

        # The deck has the plan's shape: a section per slide, a vertical one per sub-slide.
        shape = page.evaluate(_JS_DECK_SHAPE)
        planned = {
            "slides": types.count("slide"),
            "vertical": types.count("slide") + types.count("subslide"),
            "fragments": types.count("fragment"),
            "notes": types.count("notes"),
        }
        assert shape == planned, f"{name}: deck {shape}, slide plan {planned}"

        # Step through it (space: next fragment or slide); every position shows a rendered cell.
        page.locator(".reveal .slides .jp-Cell").first.click()
        page.keyboard.press("Escape")
        steps = planned["vertical"] + planned["fragments"] - 1
        positions = [page.evaluate(_JS_DECK_POSITION)]
        for step in range(steps):
            page.keyboard.press("Space")
            page.wait_for_function(
                f"(before) => JSON.stringify(({_JS_DECK_POSITION})()) !== JSON.stringify(before)",
                arg=positions[-1],
                timeout=10_000,
            )
            positions.append(page.evaluate(_JS_DECK_POSITION))
            try:
                page.wait_for_function(_JS_PRESENT_RENDERED, timeout=10_000)
            except Exception as error:
                page.screenshot(path=folder / f"step{step + 1:02d}-blank.png")
                raise AssertionError(f"{name}: nothing shown at {positions[-1]}") from error
            if positions[-1][0] < 3 and positions[-1][0] != positions[-2][0]:
                page.screenshot(path=folder / f"slide{positions[-1][0]:02d}.png")
        assert positions[-1][0] == planned["slides"] - 1, f"{name}: ended at {positions[-1]}"

        # Live code: from the first cell, run the deck's cells in order up to the explorer.
        explorer_index = next(
            i
            for i, cell in enumerate(nb["cells"])
            if cell["cell_type"] == "code" and EXPLORER_CALL.search("".join(cell["source"]))
        )
        assert "skip" not in types[:explorer_index], f"{name}: a skipped cell before the explorer"
        page.reload()  # back to the first slide, same kernel session
        page.wait_for_selector(".reveal.ready", timeout=180_000)
        page.locator(".reveal .slides .jp-Cell").first.click()
        page.keyboard.press("Escape")
        cell = page.locator(".reveal .slides .jp-Cell").nth(explorer_index)
        for _ in range(len(nb["cells"])):  # run a cell, select the next, until the explorer
            if "jp-mod-active" in (cell.get_attribute("class") or ""):
                break
            page.keyboard.press("Shift+Enter")
            time.sleep(0.3)
        else:
            raise AssertionError(f"{name}: Shift+Enter never reached the explorer's cell")
        page.keyboard.press("Control+Enter")  # run the explorer and stay on its slide
        box = cell.locator(".widget-interact").first
        try:
            box.wait_for(state="attached", timeout=RUN_TIMEOUT_S * 1000)
        except Exception as error:
            raise AssertionError(
                f"{name}: the explorer's widgets did not render on its slide; the cell shows: "
                f"{cell.inner_text()[:300]!r}"
            ) from error
        stderr = page.evaluate(_JS_STDERR_TEXTS, page.locator(".reveal").first.element_handle())
        assert not stderr, f"{name}: error or stderr output on the slides: {stderr}"
        box.scroll_into_view_if_needed()
        output = box.locator(".widget-output").first
        settled_explorer_figures(output)
        box.screenshot(path=folder / "explorer-initial.png")
        controls = box.locator(":scope > .widget-inline-hbox")
        assert controls.count() > 0, f"{name}: the explorer on the slide has no controls"
        figures = settled_explorer_figures(output)
        label = move_control(page, controls.first)
        try:
            page.wait_for_function(
                _JS_FIGURES_CHANGED, arg=[output.element_handle(), figures], timeout=60_000
            )
        except Exception as error:
            raise AssertionError(f"{name}: moving {label!r} on the slide did not redraw") from error
        settled_explorer_figures(output)
        box.screenshot(path=folder / f"explorer-{_slug(label)}.png")
        errors = [line for line in log if line.startswith(("console.error", "page error"))
                  and not any(known.fullmatch(line) for known in RISE_UPSTREAM_ERRORS)]  # fmt: skip
        assert not errors, f"{name}: errors on the deck's page:\n" + "\n".join(errors[:20])
        print(f"{name}: deck of {steps + 1} steps, explorer moved ({label})")
    except BaseException:
        page.screenshot(path=folder / "failure.png")
        raise
    finally:
        (folder / "console.log").write_text("\n".join(log))
        context.close()
        for session in lab.api("GET", "/api/sessions") if lab.process.poll() is None else []:
            if session.get("path", "").lstrip("/") == name:
                lab.api("DELETE", f"/api/sessions/{session['id']}")
    after = checkout_state(COURSE_ROOT)
    assert after == before, f"{name}: the deck changed the checkout:\n" + describe_checkout_change(
        before, after
    )


# --------------------------------------------------------------------------------------------
# The static site, built as a reader would (one command) and opened from disk in Chromium.


@pytest.fixture(scope="module")
def built_site(tmp_path_factory, artifacts) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "course_lib.classroom.site", "--out", str(out)],
        cwd=COURSE_ROOT,
        env={**os.environ, "PYTHONPATH": str(COURSE_ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.monotonic() - started
    (artifacts / "site-build.log").write_text(f"{seconds:.0f} s\n{result.stdout}{result.stderr}")
    assert result.returncode == 0, f"the site did not build:\n{result.stdout}{result.stderr}"
    print(f"site built in {seconds:.0f} s")
    return out


# MathJax 3 finishes typesetting when its startup promise resolves.
_JS_MATH = """async () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
        await MathJax.startup.promise;
    }
    const math = Array.from(document.querySelectorAll('.math'));
    return {count: math.length,
            typeset: math.filter(m => m.querySelector('mjx-container svg')).length,
            errors: document.querySelectorAll('mjx-merror, [data-mjx-error]').length};
}"""

_JS_PAGE_FACTS = """() => ({
    images: Array.from(document.images).map(img => ({src: img.src,
        ok: img.complete && img.naturalWidth > 0})),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
    title: document.title,
})"""


# What a reader sees at 1280x900: code and output blocks that need a sideways scroll, raw TeX
# or backticks left in the rendered text (outside code and typeset math), the icon, the search
# box's place, the links to the instructor's guides, the copy buttons. (The icon a page links is
# opened on its own afterwards: an image made by a script is refused under the offline route.)
_JS_READING = """() => {
    const body = document.querySelector('div.body') || document.body;
    const blocks = Array.from(body.querySelectorAll(
        'pre, div.highlight, div.cell_output > div.output'));
    const overflowing = blocks.filter(b => b.scrollWidth > b.clientWidth + 1)
        .map(b => `${b.scrollWidth}>${b.clientWidth}px: ${b.innerText.trim().slice(0, 50)}`);
    const unrendered = [];
    const walker = document.createTreeWalker(body, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        if (node.parentElement.closest('pre, code, kbd, script, style, .math, mjx-container'))
            continue;
        if (['$', '`', '\\\\(', '\\\\['].some(mark => node.textContent.includes(mark)))
            unrendered.push(node.textContent.trim().slice(0, 80));
    }
    const icon = document.querySelector('link[rel~="icon"]');
    const search = document.querySelector('div.sphinxsidebar input[name="q"]');
    const box = search ? search.getBoundingClientRect() : null;
    return {overflowing, unrendered, icon: icon ? icon.href : null,
            searchVisible: !!box && box.height > 0 && box.top >= 0 && box.bottom <= innerHeight,
            bodyLinks: Array.from(body.querySelectorAll('a[href]')).map(a => a.href),
            copyButtons: document.querySelectorAll('button.copybtn').length,
            codeBlocks: body.querySelectorAll('div.highlight').length};
}"""


def reading_problems(where: Path, stem: str, facts: dict, guides: set[str]) -> list[str]:
    """What `_JS_READING` found wrong on one page."""
    problems = [f"{where}: block needs a sideways scroll: {b}" for b in facts["overflowing"]]
    problems += [f"{where}: raw TeX or backticks in the text: {t!r}" for t in facts["unrendered"]]
    if not facts["icon"]:
        problems.append(f"{where}: no icon linked")
    if where.name != "search.html" and not facts["searchVisible"]:
        problems.append(f"{where}: the search box is not in view at 1280x900")
    if facts["codeBlocks"] and facts["copyButtons"] < facts["codeBlocks"]:
        problems.append(f"{where}: {facts['copyButtons']} copy buttons, "
                        f"{facts['codeBlocks']} code blocks")  # fmt: skip
    if stem in guides and where.parent.name != "guides":
        guide = f"/guides/{stem}.html"
        if not any(urllib.parse.urlparse(h).path.endswith(guide) for h in facts["bodyLinks"]):
            problems.append(f"{where}: the chapter does not link its guide ({guide[1:]})")
    return problems


def _open_offline(context, log: list[str]):
    """A page whose every request that is not for a file on disk is refused and recorded."""
    page = context.new_page()
    page.on("console", lambda m: log.append(f"console.{m.type}: {m.text}"))
    page.on("pageerror", lambda error: log.append(f"page error: {error}"))

    def route(request_route):
        url = request_route.request.url
        if url.startswith(("file:", "data:", "blob:")):
            request_route.continue_()
        else:
            log.append(f"network request: {url}")
            request_route.abort()

    page.route("**/*", route)
    return page


def test_site_pages_load_from_disk_with_math_images_and_links(built_site, browser, artifacts):
    pages = sorted(built_site.rglob("*.html"))
    chapters = {p.stem for p in (COURSE_ROOT / "notebooks").glob("*.ipynb")}
    assert chapters <= {p.stem for p in pages}, sorted(chapters - {p.stem for p in pages})
    guides = {p.stem for p in (COURSE_ROOT / "notebooks" / "guides").glob("*.md")} & chapters
    # a browser asks a server for /favicon.ico on its own: the site's root has one (opened below)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    problems, ids, links, math_total, icons = [], {}, [], 0, set()
    try:
        for path in pages:
            log: list[str] = []
            page = _open_offline(context, log)
            page.goto(path.as_uri(), wait_until="load")
            math = page.evaluate(_JS_MATH)
            facts = page.evaluate(_JS_PAGE_FACTS)
            where = path.relative_to(built_site)
            math_total += math["count"]
            if math["typeset"] != math["count"] or math["errors"]:
                problems.append(f"{where}: math typeset {math['typeset']}/{math['count']}, "
                                f"{math['errors']} errors")  # fmt: skip
            problems += [f"{where}: image did not load: {i['src']}" for i in facts["images"]
                         if not i["ok"]]  # fmt: skip
            problems += [f"{where}: {line}" for line in log
                         if line.startswith(("console.error", "page error", "network"))]  # fmt: skip
            reading = page.evaluate(_JS_READING)
            problems += reading_problems(where, path.stem, reading, guides)
            icons.add(reading["icon"] or "")
            ids[path.resolve()] = set(facts["ids"])
            links += [(where, href) for href in facts["links"] if href.startswith("file:")]
            if path.stem in ("index", "03_rope"):
                page.screenshot(path=artifacts / f"site-{path.stem}.png", full_page=False)
            page.close()
        page = context.new_page()
        for icon in sorted(icons - {""} | {(built_site / "favicon.ico").as_uri()}):
            try:
                page.goto(icon)
                width = page.evaluate("() => (document.images[0] || {}).naturalWidth || 0")
            except Exception as error:  # a missing file fails the navigation
                width = f"{type(error).__name__}: {error}".splitlines()[0]
            if not isinstance(width, int) or width <= 0:
                problems.append(f"the icon did not load: {icon} ({width})")
        page.close()
    finally:
        context.close()
    for where, href in links:
        parsed = urllib.parse.urlparse(href)
        target = Path(urllib.parse.unquote(parsed.path)).resolve()
        if not target.exists():
            problems.append(f"{where}: link to a missing file: {href}")
        elif parsed.fragment and target.suffix == ".html":
            if parsed.fragment not in ids.get(target, set()):
                problems.append(f"{where}: link to a missing anchor: {href}")
    assert math_total > 100, f"only {math_total} formulas on the whole site"
    assert not problems, f"{len(problems)} problems on the site:\n" + "\n".join(problems[:40])
    print(f"site: {len(pages)} pages, {math_total} formulas, {len(links)} internal links checked")


def test_site_search_works_from_disk(built_site, browser):
    context = browser.new_context()
    log: list[str] = []
    try:
        page = _open_offline(context, log)
        page.goto((built_site / "search.html").as_uri() + "?q=rotation")
        page.wait_for_selector("ul.search li a", timeout=30_000)
        found = page.eval_on_selector_all("ul.search li a", "links => links.map(a => a.href)")
        assert any("03_rope.html" in href for href in found), found
        errors = [line for line in log if line.startswith(("console.error", "page error", "net"))]
        assert not errors, errors
    finally:
        context.close()
