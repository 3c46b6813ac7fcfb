"""`ladmac sweep lad --address`: a real Ray cluster started with `ray start --head` at Ray's
defaults, with token authentication on (as on any machine where a local `ray.init()` has left
a token in ~/.ray/auth_token), runs a two-point sweep; a client without the token is refused in
one line, and so is an address where nothing answers.

The head gets its own HOME (its token, nobody else's ~/.ray), its own --temp-dir (other Ray
instances on the machine neither find it nor share its files) and its own process group, which
the fixture kills whole at the end: `ray stop` would stop every Ray instance on the machine."""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from golden.paths import CACHE_ROOT

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))
START_S = 90     # the head's start-up, on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(home: Path) -> dict[str, str]:
    """This environment with Ray's own defaults (no auth mode, token or address set) and ``home``
    as HOME; the model cache and matplotlib's font cache stay where this process has them."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")}
    env.update(HOME=str(home), LADMAC_CACHE=str(CACHE_ROOT),
               MPLCONFIGDIR=env.get("MPLCONFIGDIR", str(Path.home() / ".cache" / "matplotlib")))
    return env


def ladmac(*argv: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ladmac_cli", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def ray_head():
    """(address, HOME holding the cluster's token, the head's temp dir) of a Ray head started with
    `ray start --head --port P` after `ray get-auth-token --generate`: token authentication on."""
    work = Path(tempfile.mkdtemp(prefix="ladmac-ray-"))   # short: Ray's socket paths live under it
    home = work / "home"
    home.mkdir()
    env = clean_env(home)
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, capture_output=True, check=True, timeout=60)
    assert (home / ".ray" / "auth_token").stat().st_size > 0
    port = free_port()
    log = work / "head.log"
    # the dashboard agent's fixed default port is a free one instead, so that a Ray instance
    # someone else runs on this machine does not collide with this head
    cmd = [RAY, "start", "--head", "--port", str(port), "--num-cpus", "2", "--temp-dir", str(work / "ray"),
           "--include-dashboard", "false", "--disable-usage-stats", "--dashboard-agent-listen-port",
           str(free_port()), "--block"]
    with open(log, "w") as out:
        head = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + START_S
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None, f"ray start exited {head.returncode}: {log.read_text()[-2000:]}"
            assert time.time() < deadline, f"no Ray head after {START_S} s: {log.read_text()[-2000:]}"
            time.sleep(0.5)
        assert "Token authentication is enabled" in log.read_text()
        yield f"127.0.0.1:{port}", home, work / "ray"
    finally:   # the head and everything it started (GCS, raylet, workers, their evals): one group
        try:
            os.killpg(head.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        head.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


def test_sweep_runs_on_a_cluster_started_with_ray_start(ray_head, tmp_path):
    address, home, ray_dir = ray_head
    t0 = time.time()
    done = ladmac("sweep", "lad", "--set", "center_cos=0.5,0.98", "--tokens", "24", "--out", str(tmp_path),
                  "--address", address, env=clean_env(home), timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 points, 0 cached, 2 to run" in done.stderr
    assert "InvalidAuthToken" not in done.stderr and "Traceback" not in done.stderr
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    assert [r["point"] for r in rows] == [{"center_cos": "0.5"}, {"center_cos": "0.98"}]
    for r in rows:
        assert "error" not in r, r
        assert math.isfinite(r["perplexity"]) and r["perplexity"] > 1
        assert math.isfinite(r["full"]) and 1 < r["full"] < 1000 and r["full"] == rows[0]["full"]
        assert 0 < r["keys_read_pct"] <= 100
    # the looser center test merges more keys into fewer centers and costs perplexity; the tight
    # one stays near full attention
    assert rows[0]["centers_mean"] < rows[1]["centers_mean"]
    assert rows[0]["perplexity"] > rows[1]["perplexity"] and abs(rows[1]["delta_pct"]) < 25
    # the sweep's driver was this head's job (its core log is in the head's session), not a local Ray
    assert list(ray_dir.glob("session_latest/logs/python-core-driver-*.log"))
    print(f"two-point sweep on the cluster: {time.time() - t0:.1f} s")


def test_a_client_without_the_token_is_told_what_to_set(ray_head, tmp_path):
    address, _, _ = ray_head
    env = {**clean_env(tmp_path), "RAY_AUTH_MODE": "token"}   # a HOME with no ~/.ray/auth_token
    done = ladmac("sweep", "lad", "--set", "center_cos=0.9", "--tokens", "4", "--out", str(tmp_path / "out"),
                  "--address", address, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"ladmac: error: --address {address}: RAY_AUTH_MODE is token but no Ray authentication token was found; "
        "set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, a file) to the cluster's token, which `ray get-auth-token` "
        "prints on its head node"]


def test_an_address_where_nothing_answers_is_one_line(tmp_path):
    port = free_port()   # bound and released: nothing listens there now
    done = ladmac("sweep", "lad", "--set", "center_cos=0.9", "--tokens", "4", "--out", str(tmp_path),
                  "--address", f"127.0.0.1:{port}", env=clean_env(tmp_path), timeout=120)
    assert done.returncode == 2
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and f"--address 127.0.0.1:{port}: nothing answers there" in err[0], done.stderr
    assert f"ray start --head --port {port}" in err[0]
