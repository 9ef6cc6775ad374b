"""Ctrl-C while `qkstudy submit` follows its job ends the command in bounded time, whatever the
dashboard does: here a real aiohttp server on loopback stands in for Ray's Job Submission API
(version check, submit, the logs websocket), sends one log line, then keeps the websocket open
and silent. The command must exit 130 and say the job keeps running, also when it was started
with SIGINT ignored (as a background command of a script or a CI job inherits it: Python then
installs no KeyboardInterrupt handler of its own)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from orchestrator.run.driver.submit import follow_logs
from tests.helpers import QKSTUDY

SPEC = (
    "name: s\nscales: [cpu-xs]\nvariants: [standard]\nbudget: {tokens: 40960}\n"
    "tracking_uri: http://mlflow:5000\nstorage_path: /shared/qkstudy/s\n"
)
EXIT_S = 30  # the command's own bound is two 5 s close steps; the rest is slack for a loaded machine


@dataclass
class Dashboard:
    url: str
    closed: threading.Event  # set when a client closed its logs websocket


@pytest.fixture
def stalling_dashboard() -> Iterator[Dashboard]:
    """A server that accepts a job and a logs websocket, sends one line, then stalls."""
    loop = asyncio.new_event_loop()
    closed = threading.Event()

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "4", "ray_version": "2.60.0", "ray_commit": "0"})

    async def submit(request: web.Request) -> web.Response:
        return web.json_response({"submission_id": (await request.json())["submission_id"], "job_id": None})

    async def tail(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str("started\n")
        await ws.receive()  # silent until the client closes the stream (or the server stops)
        closed.set()
        return ws

    app = web.Application()
    app.router.add_get("/api/version", version)
    app.router.add_post("/api/jobs/", submit)
    app.router.add_get("/api/jobs/{job}/logs/tail", tail)
    runner = web.AppRunner(app, shutdown_timeout=1)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield Dashboard(f"http://127.0.0.1:{port}", closed)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_ctrl_c_ends_a_follow_of_a_silent_stream_and_leaves_the_job_running(stalling_dashboard, tmp_path: Path, sigint):
    (tmp_path / "s.yaml").write_text(SPEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    trap = "trap '' INT; " if sigint == "ignored" else ""
    follow = subprocess.Popen(
        ["sh", "-c", trap + 'exec "$0" "$@"', str(QKSTUDY), "submit", "s.yaml", "--address", stalling_dashboard.url, "--no-upload"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        job_id = follow.stdout.readline().strip()
        assert job_id.startswith("raysubmit_"), follow.communicate(timeout=EXIT_S)
        assert follow.stdout.readline() == "started\n"  # following: the websocket is open
        assert follow.poll() is None  # the control: the silent stream alone does not end the follow
        follow.send_signal(signal.SIGINT)
        out, err = follow.communicate(timeout=EXIT_S)
    finally:
        if follow.poll() is None:  # still following: the test failed, end it
            follow.kill()
            follow.communicate()
    assert follow.returncode == 130, out[-2000:] + err[-2000:]
    assert f"job {job_id} keeps running" in " ".join(err.split()), err[-2000:]


def test_a_follow_ended_between_reads_closes_its_websocket(stalling_dashboard):
    # ended where Ctrl-C lands while a chunk is written: the stream waits at its yield, outside the loop
    logs = follow_logs(stalling_dashboard.url, "raysubmit_any")
    assert next(logs) == "started\n"
    logs.close()
    assert stalling_dashboard.closed.wait(10), "the websocket was left open"
