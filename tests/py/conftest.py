"""Fixtures for tests that drive the real `sluice serve` binary.

The binary comes from $SLUICE_BIN (set by ctest), the model from
$SLUICE_MODEL or <source dir>/models/. Tests that need either skip when it
is missing. `sluice_server(args)` starts an extra instance; the session-wide
`server` fixture is the default one.
"""
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

SRC = pathlib.Path(os.environ.get("SLUICE_SOURCE_DIR",
                                  pathlib.Path(__file__).resolve().parents[2]))
DEFAULT_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2"


def model_path():
    p = os.environ.get("SLUICE_MODEL") or str(SRC / "models" / DEFAULT_MODEL)
    return p if os.path.exists(p) else None


def sluice_bin():
    p = os.environ.get("SLUICE_BIN")
    return p if p and os.path.exists(p) else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args, env=None, model=None, bare=False):
        """bare: only `args` name the models (no -m, no --model-name)."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(f"/tmp/sluice_serve_{self.port}.log", "w+b")
        models = [] if bare else ["-m", model or model_path(),
                                  "--model-name", MODEL_NAME]
        cmd = ([sluice_bin(), "serve"] + models + ["--port", str(self.port)] +
               list(args))
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log,
                                     env=env)
        self.wait_ready()

    def log_text(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_ready(self, timeout=180):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("sluice serve exited %d:\n%s" %
                                   (self.proc.returncode, self.log_text()))
            try:
                with urllib.request.urlopen(self.base + "/health",
                                            timeout=2) as r:
                    if r.status == 200 and json.load(r)["status"] == "ok":
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError("sluice serve did not become ready:\n" +
                           self.log_text())

    def stop(self, timeout=60):
        """SIGTERM; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def chromium(extra_args=()):
    """Headless Chromium (Debian's chromium and chromium-driver) through
    Selenium, with the network limited to this machine; the caller quits
    it. Skips, saying why, only where Chromium cannot start."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        pytest.skip("selenium is not installed: %s" % e)
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chrome or not driver:
        pytest.skip("Chromium cannot start: chromium or chromedriver missing "
                    "(Debian: apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu",
              "--disable-dev-shm-usage", "--window-size=1400,1800",
              "--no-proxy-server", "--disable-extensions",
              "--disable-background-networking") + tuple(extra_args):
        opts.add_argument(a)
    try:
        d = webdriver.Chrome(service=Service(driver), options=opts)
    except Exception as e:  # noqa: BLE001 (any start failure is a skip)
        pytest.skip("Chromium cannot start: %s" % str(e).splitlines()[0])
    d.set_page_load_timeout(60)
    return d


def metric(srv, name, *more):
    """A /metrics value: the line whose name (with its labels, when `name`
    gives them) is `name`; without labels, the first labelled line of that
    name too. With more names: the sum of theirs, from the same answer (one
    snapshot: a request moving from waiting to running between two reads
    would count twice)."""
    with urllib.request.urlopen(srv.base + "/metrics", timeout=60) as r:
        text = r.read().decode()
    total = 0.0
    for n in (name,) + more:
        for line in text.splitlines():
            key = line.split(" ")[0]
            if key == n or ("{" not in n and key.startswith(n + "{")):
                total += float(line.split()[-1])
                break
        else:
            raise AssertionError("no metric " + n)
    return total


def _need_everything():
    if not model_path():
        pytest.skip("no model (set SLUICE_MODEL or put %s in models/)" %
                    DEFAULT_MODEL)
    if not sluice_bin():
        pytest.skip("no sluice binary (set SLUICE_BIN)")
    try:
        import anthropic  # noqa: F401
        import openai  # noqa: F401
    except ImportError as e:
        pytest.skip("missing SDK: %s" % e)


@pytest.fixture(scope="session")
def sluice_server():
    """Factory: sluice_server(["--api-key", "k"]) starts one more instance
    (of another GGUF file with model=PATH), stopped at the end of the
    session."""
    _need_everything()
    started = []

    def start(args=(), model=None, bare=False, env=None):
        s = Server(args, model=model, bare=bare, env=env)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def server(sluice_server):
    return sluice_server(["-c", "2048"])
