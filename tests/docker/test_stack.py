"""The user's cluster flow, for real, on this machine's Docker engine (docker/README.md, "CPU
stack on one machine"): `make stack-up` (images from the debootstrap base, cached), `qkstudy
submit` a small study to the head's Job Submission API, `qkstudy status` / `qkstudy logs`
against it, the Ray worker container killed mid-run and started again (the run resumes from
its checkpoint on shared storage, no metric step twice), `qkstudy report --tracking-uri` the
stack's MLflow server, a resubmit that trains nothing; the containers' hardening and networks
(Postgres unreachable from a Ray node); `make backup`, `make stack-down` keeping the volumes,
`make stack-down PURGE=1`, `make restore`, `make stack-up` giving the same report and files
(the module's only second bring-up); `make stack-down PURGE=1` leaving nothing.

One module-scoped stack, its own compose project, fresh secrets and free ports: it never
touches a stack the user runs. Wall-clock on the 2-core dev machine (shared): see the
numbers printed at the end (`pytest -s`), also in the issue notes.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.track.tracking import run_tags
from tests import helpers
from tests.helpers import REPO, free_port

# The module fixture builds the images when .ci/run's background build has not (cold: minutes)
# and runs the study: more than `make test`'s per-test --timeout=1200. Marked `stack`: pytest
# runs it in the stack tier, after any image build (tests/fixtures/tiers.py).
pytestmark = [pytest.mark.slow, pytest.mark.stack, pytest.mark.timeout(3600)]

if os.environ.get("QKSTUDY_STACK_TEST") == "0":
    pytest.skip("QKSTUDY_STACK_TEST=0: the compose-stack flow is switched off", allow_module_level=True)

STUDY = "stack-flow"
SPEC = f"""\
name: {STUDY}
corpus: {{source: stdlib, max_documents: 60}}
tokenizer: {{vocab_size: 512}}
scales: [cpu-xs]
variants: [standard, {{name: coupled, options: {{integrator: euler, n_steps: 1}}}}]
budget: {{mode: flops, tokens: 81920}}
extend: [2]
train: {{global_batch: 8, seq_len: 64}}
eval: {{num_evals: 8, max_windows: 8, final_max_windows: 16, diagnostics: false}}
resources: {{workers: 1, cpus_per_worker: 1, zero_stage: 2, max_retries: 3}}
tracking_uri: http://mlflow:5000
storage_path: /shared/qkstudy/{STUDY}
"""
TIMINGS: dict[str, float] = {}


def key(entry: dict) -> tuple[str, str, str, str]:
    """(variant, scale, seed, extend) of a planned run or of an MLflow run's tags. Not the run
    id: the cluster hashes its own data manifest (its Python's stdlib corpus), the host's plan
    another, but the planned runs and their tokens are the same."""
    return (entry["variant"], entry["scale"], str(entry["seed"]), f"{float(entry['extend']):g}")


def run(
    argv: list[str], *, env: dict[str, str], cwd: Path = REPO, timeout: float = 900, log: Path | None = None
) -> subprocess.CompletedProcess:
    """Run a command; with `log`, its output goes there (builds are long) and the tail is kept."""
    if log is None:
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    with open(log, "w") as fh:
        res = subprocess.run(argv, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    res.stdout = log.read_text(errors="replace")[-6000:]
    return res


def timed(key: str, fn, *args, **kwargs):
    t0 = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        TIMINGS[key] = round(time.monotonic() - t0, 1)


def project_objects(docker: str, project: str) -> dict[str, list[str]]:
    """Containers, networks and volumes compose created for `project`."""
    label = f"label=com.docker.compose.project={project}"
    found = {}
    for kind, cmd in (("containers", ["ps", "-aq"]), ("networks", ["network", "ls", "-q"]), ("volumes", ["volume", "ls", "-q"])):
        out = subprocess.run([docker, *cmd, "--filter", label], capture_output=True, text=True, timeout=60).stdout
        found[kind] = out.split()
    return found


@pytest.fixture(scope="module")
def stack(docker_engine, tmp_path_factory):
    """The stack up for this module: yields a dict of what the tests need; always torn down."""
    if shutil.which("docker-compose") is None and run([docker_engine, "compose", "version"], env=dict(os.environ)).returncode:
        pytest.skip("no compose implementation (apt-get install docker-compose; .ci/run does)")
    base = run([docker_engine, "image", "inspect", "qkstudy-base:bookworm"], env=dict(os.environ))
    if base.returncode and os.geteuid() != 0:
        pytest.skip("the debootstrap base image is missing and building it needs root (make base-image)")
    tmp = tmp_path_factory.mktemp("stack")
    project = f"qkstudy-test-{secrets.token_hex(3)}"
    ports = {"RAY_DASHBOARD_PORT": free_port(), "MLFLOW_PORT": free_port()}
    values = {
        "COMPOSE_PROJECT_NAME": project,
        "MLFLOW_ADMIN_PASSWORD": secrets.token_urlsafe(24),
        "QKSTUDY_TRAINING_PASSWORD": secrets.token_urlsafe(24),
        "QKSTUDY_READER_PASSWORD": secrets.token_urlsafe(24),
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_urlsafe(32),
        "POSTGRES_PASSWORD": secrets.token_urlsafe(24),
        "RAY_SHM_SIZE": "1gb",
        **{k: str(v) for k, v in ports.items()},
    }
    lines = []
    for line in (REPO / "docker" / ".env.example").read_text().splitlines():
        key = line.partition("=")[0]
        lines.append(f"{key}={values[key]}" if key in values else line)
    env_file = tmp / "stack.env"
    env_file.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "ENV_FILE": str(env_file)}
    env.pop("RAY_ADDRESS", None)
    example = dict(line.partition("=")[::2] for line in lines if "=" in line and not line.startswith("#"))
    info = {
        "project": project,
        "env_file": env_file,
        "tmp": tmp,
        "docker": docker_engine,
        "dashboard": f"http://127.0.0.1:{ports['RAY_DASHBOARD_PORT']}",
        "mlflow": f"http://127.0.0.1:{ports['MLFLOW_PORT']}",
        "values": example,
        "make_env": env,
    }
    # The user's shell: Ray token for submit/status/logs, the MLflow admin for status/report.
    info["env"] = {
        **{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": values["RAY_AUTH_TOKEN"],
        "MLFLOW_TRACKING_USERNAME": example["MLFLOW_ADMIN_USERNAME"],
        "MLFLOW_TRACKING_PASSWORD": values["MLFLOW_ADMIN_PASSWORD"],
    }
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    t_start = time.monotonic()
    try:
        # Placeholders are refused before anything starts.
        placeholder = tmp / "placeholder.env"
        placeholder.write_text(
            (REPO / "docker" / ".env.example").read_text().replace("COMPOSE_PROJECT_NAME=qkstudy", f"COMPOSE_PROJECT_NAME={project}")
        )
        res = run(["docker/stack.sh", "up"], env={**env, "ENV_FILE": str(placeholder)})
        assert res.returncode == 2 and "RAY_AUTH_TOKEN is still a placeholder" in res.stderr, res.stderr
        assert project_objects(docker_engine, project)["containers"] == []

        res = timed("make stack-up", run, ["make", "stack-up", f"ENV_FILE={env_file}"], env=env, timeout=3600, log=tmp / "stack-up.log")
        assert res.returncode == 0, res.stdout
        yield info
    finally:
        res = timed("make stack-down PURGE=1", run, ["make", "stack-down", "PURGE=1", f"ENV_FILE={env_file}"], env=env, timeout=300)
        left = project_objects(docker_engine, project)
        for k, v in saved.items():  # mlflow_client() set the admin account for this module only
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        TIMINGS["stack module total"] = round(time.monotonic() - t_start, 1)
        print(f"\nstack timings (s): {json.dumps(TIMINGS)}")
        assert res.returncode == 0, res.stdout + res.stderr
        assert left == {"containers": [], "networks": [], "volumes": []}, left


def test_containers_are_hardened_and_ray_cannot_reach_postgres(stack) -> None:
    """From `docker inspect`: no capabilities, no-new-privileges, memory and pids limits, rotated
    json-file logs (Ray keeps its shm). From a Ray worker: MLflow answers, Postgres does not
    even resolve (it is on the internal backend network only). MLflow's role is no superuser."""
    docker = stack["docker"]
    for service in ("ray-head", "ray-worker", "mlflow", "mlflow-users", "postgres"):
        out = subprocess.run(
            [docker, "inspect", "--format", "{{json .HostConfig}}", container(stack, service)], capture_output=True, text=True, check=True
        ).stdout
        hc = json.loads(out)
        assert hc["CapDrop"] == ["ALL"] and not hc["CapAdd"] and not hc["Privileged"], (service, hc["CapDrop"], hc["CapAdd"])
        assert "no-new-privileges:true" in hc["SecurityOpt"], service
        assert hc["Memory"] > 0 and hc["PidsLimit"] > 0, service
        assert hc["LogConfig"]["Type"] == "json-file" and hc["LogConfig"]["Config"]["max-size"] == "10m", service
        if service.startswith("ray-"):
            assert hc["ShmSize"] >= 2**30, service  # RAY_SHM_SIZE=1gb here
    probe = """
import socket, urllib.request
try:
    socket.create_connection(("postgres", 5432), timeout=5).close()
    print("postgres: reachable")
except OSError as e:
    print("postgres: unreachable", type(e).__name__)
print("mlflow:", urllib.request.urlopen("http://mlflow:5000/health", timeout=10).status)
"""
    res = subprocess.run(
        [docker, "exec", container(stack, "ray-worker"), "python3", "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert "postgres: unreachable gaierror" in res.stdout and "mlflow: 200" in res.stdout, res.stdout
    sql = ["psql", "-tAc", f"SELECT rolsuper FROM pg_roles WHERE rolname = '{stack['values']['POSTGRES_USER']}'"]
    res = subprocess.run([docker, "exec", container(stack, "postgres"), *sql], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "f", res.stdout + res.stderr


def qk(stack: dict, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``qkstudy ARGS`` against the stack, from its folder."""
    return helpers.qk(*args, cwd=stack["tmp"], env=stack["env"], timeout=timeout)


def mlflow_client(stack: dict):
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_TRACKING_USERNAME"] = stack["env"]["MLFLOW_TRACKING_USERNAME"]
    os.environ["MLFLOW_TRACKING_PASSWORD"] = stack["env"]["MLFLOW_TRACKING_PASSWORD"]
    return MlflowClient(stack["mlflow"])


def train_runs(client) -> list:
    exp = client.get_experiment_by_name(STUDY)
    return [] if exp is None else client.search_runs([exp.experiment_id], "tags.`qkstudy.kind` = 'train'")


def container(stack: dict, service: str) -> str:
    res = subprocess.run(
        [
            stack["docker"],
            "ps",
            "-aq",
            "--filter",
            f"label=com.docker.compose.project={stack['project']}",
            "--filter",
            f"label=com.docker.compose.service={service}",
        ],
        capture_output=True,
        text=True,
    )
    (cid,) = res.stdout.split()
    return cid


def study_jobs(stack: dict) -> list[dict]:
    """The study's Ray jobs, through `qkstudy status` (once MLflow holds the study)."""
    res = qk(stack, "status", STUDY, "--tracking-uri", stack["mlflow"], "--address", stack["dashboard"], "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)["jobs"]


def job_status(stack: dict, job_id: str) -> str:
    """Ray's status of a job. In a subprocess: Ray reads its auth settings once per process,
    and this one may have imported Ray (test collection) without the stack's token."""
    code = f"from orchestrator.run.driver.submit import job_status; print(job_status({stack['dashboard']!r}, {job_id!r}))"
    res = run([sys.executable, "-c", code], env=stack["env"], timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip()


def wait_job(stack: dict, job_id: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while (state := job_status(stack, job_id)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.monotonic() < deadline, f"job {job_id} still {state} after {timeout_s} s"
        time.sleep(5)
    return state


@pytest.fixture(scope="module")
def study(stack):
    """Submit the study, kill the Ray worker container once a run has checkpointed, start it
    again, wait for the job. Yields (stack, job_id, {run key: checkpointed tokens at the kill},
    plan, the job's logs)."""
    (stack["tmp"] / "study.yaml").write_text(SPEC)
    plan = json.loads(qk(stack, "plan", "study.yaml", "--json").stdout)
    t0 = time.monotonic()
    res = qk(stack, "submit", "study.yaml", "--address", stack["dashboard"], "--no-wait")
    assert res.returncode == 0, res.stdout + res.stderr
    job_id = res.stdout.strip().splitlines()[-1]
    client = mlflow_client(stack)
    killed: dict[tuple[str, str, str, str], int] = {}

    def kill_once_checkpointed() -> None:
        if killed:
            return
        for r in train_runs(client):
            planned = next(p["tokens"] for p in plan if key(p) == key(run_tags(r.data.tags)))
            ckpt = client.get_metric_history(r.info.run_id, "checkpoint/bytes")
            if r.info.status == "RUNNING" and ckpt and ckpt[-1].step < planned:
                worker = container(stack, "ray-worker")
                subprocess.run([stack["docker"], "kill", worker], check=True, capture_output=True)
                killed[key(run_tags(r.data.tags))] = ckpt[-1].step  # tokens of the checkpoint it must resume from
                time.sleep(10)  # the node is gone: Ray notices and the trainer waits for resources
                subprocess.run([stack["docker"], "start", worker], check=True, capture_output=True)
                TIMINGS["killed at (s after submit)"] = round(time.monotonic() - t0, 1)
                return

    # Poll MLflow every second until a run has checkpointed (or the job ended without one).
    t_poll = time.monotonic()
    while not killed and time.monotonic() - t_poll < 900:
        kill_once_checkpointed()
        if not killed and int(time.monotonic() - t_poll) % 15 == 0:
            if job_status(stack, job_id) in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
        time.sleep(1)
    status = timed("study job (3 runs, one kill)", wait_job, stack, job_id, 1500)
    logs = qk(stack, "logs", job_id, "--address", stack["dashboard"], "--no-follow")
    assert status == "SUCCEEDED", logs.stdout[-6000:] + logs.stderr[-2000:]
    assert killed, "no run was seen mid-way with a checkpoint: nothing was killed"
    yield stack, job_id, killed, plan, logs.stdout


def test_every_planned_run_finished_once_at_its_tokens(study) -> None:
    stack, _, _, plan, _ = study
    client = mlflow_client(stack)
    runs = train_runs(client)
    assert sorted(key(run_tags(r.data.tags)) for r in runs) == sorted(key(p) for p in plan)  # one per planned run
    assert len({r.data.tags["qkstudy.run_id"] for r in runs}) == len(plan)
    by_key = {key(run_tags(r.data.tags)): r for r in runs}
    for p in plan:
        r = by_key[key(p)]
        assert r.info.status == "FINISHED" and r.data.tags["qkstudy.status"] == "finished"
        tokens = client.get_metric_history(r.info.run_id, "tokens")
        assert tokens[-1].step == p["tokens"] == r.data.metrics["tokens"]
        for metric in ("train/loss", "val/loss", "tokens"):
            steps = [m.step for m in client.get_metric_history(r.info.run_id, metric)]
            assert steps == sorted(set(steps)), f"{metric}: a step logged twice in {r.data.tags['run_id']}"


def test_killed_runs_resumed_from_their_checkpoint(study) -> None:
    stack, _, killed, plan, _ = study
    client = mlflow_client(stack)
    by_key = {key(run_tags(r.data.tags)): r for r in train_runs(client)}
    for k, checkpointed in killed.items():
        tags = by_key[k].data.tags
        assert int(tags.get("qkstudy.restarts", "0")) >= 1, (k, tags)
        assert checkpointed <= int(tags["qkstudy.resumed_from_tokens"]) < next(p["tokens"] for p in plan if key(p) == k)


def test_runs_logged_as_the_training_account_and_nodes_hold_no_server_secret(study) -> None:
    from mlflow.server.auth.client import AuthServiceClient

    stack, *_ = study
    values = stack["values"]
    mlflow_client(stack)  # admin credentials in the environment
    exp = mlflow_client(stack).get_experiment_by_name(STUDY)
    perm = AuthServiceClient(stack["mlflow"]).get_user_permission(values["QKSTUDY_TRAINING_USERNAME"], "experiment", exp.experiment_id)
    assert perm.permission == "MANAGE"  # the creator: training created the experiment
    assert AuthServiceClient(stack["mlflow"]).get_user(values["QKSTUDY_TRAINING_USERNAME"]).is_admin is False
    for service in ("ray-head", "ray-worker"):
        env = subprocess.run(
            [stack["docker"], "inspect", "--format", "{{json .Config.Env}}", container(stack, service)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for secret in ("MLFLOW_ADMIN_PASSWORD", "POSTGRES_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
            assert values[secret] not in env, (service, secret)
        # DeepSpeed's op was prebuilt: nothing was JIT-compiled on the node.
        ls = subprocess.run(
            [stack["docker"], "exec", container(stack, service), "ls", "/home/qkstudy/.cache/torch_extensions"],
            capture_output=True,
            text=True,
        )
        assert ls.returncode != 0, ls.stdout


def test_status_and_logs_against_the_cluster(study) -> None:
    stack, job_id, _, plan, logs = study
    assert f"{STUDY}: {len(plan)} planned runs" in logs
    # By study name: a spec would add the host's own plan, whose run ids hash the host's data.
    res = qk(stack, "status", STUDY, "--tracking-uri", stack["mlflow"], "--address", stack["dashboard"], "--json")
    state = json.loads(res.stdout)
    assert sorted(r["status"] for r in state["runs"]) == ["finished"] * len(plan)
    assert [j["job_id"] for j in state["jobs"]] == [job_id]


def test_published_ports_demand_credentials(study) -> None:
    """The Jobs API without the Ray token and MLflow without basic auth are refused."""
    import urllib.error
    import urllib.request

    stack, *_ = study
    for url in (stack["dashboard"] + "/api/jobs/", stack["mlflow"] + "/api/2.0/mlflow/experiments/search?max_results=1"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=30)
        assert refused.value.code in (401, 403), url


def test_report_from_the_stacks_mlflow(study) -> None:
    stack, *_ = study
    out = stack["tmp"] / "report"
    res = qk(stack, "report", STUDY, "--tracking-uri", stack["mlflow"], "--out", str(out), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    (scale,) = json.loads(res.stdout)
    assert scale["scale"] == "cpu-xs" and set(scale["final_ppl"]) == {"standard", "coupled"}
    assert scale["token_ratio_display"] != "n/a"  # a ratio, or censored with its bound
    assert (out / "ppl_vs_tokens.png").stat().st_size > 0 and (out / "token_ratio.png").stat().st_size > 0
    assert "oken ratio" in (out / "report.md").read_text()
    # The reader account the bootstrap created reads the study; the report is not logged by it.
    values = stack["values"]
    reader = {
        **stack["env"],
        "MLFLOW_TRACKING_USERNAME": values["QKSTUDY_READER_USERNAME"],
        "MLFLOW_TRACKING_PASSWORD": values["QKSTUDY_READER_PASSWORD"],
    }
    res = helpers.qk(
        "report",
        STUDY,
        "--tracking-uri",
        stack["mlflow"],
        "--out",
        str(stack["tmp"] / "report-reader"),
        cwd=stack["tmp"],
        env=reader,
        timeout=300,
    )
    assert res.returncode == 0 and "not logged to MLflow" in res.stderr, res.stdout + res.stderr

    def scales(folder):
        return json.loads((folder / "summary.json").read_text())["scales"]

    assert scales(stack["tmp"] / "report-reader") == scales(out)  # the same numbers


def test_resubmit_trains_nothing(study) -> None:
    stack, first_job, _, plan, _ = study
    client = mlflow_client(stack)
    before = {r.info.run_id: len(client.get_metric_history(r.info.run_id, "train/loss")) for r in train_runs(client)}
    res = qk(stack, "submit", "study.yaml", "--address", stack["dashboard"], "--no-wait")
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip().splitlines()[-1]
    assert timed("resubmit job", wait_job, stack, job_id, 600) == "SUCCEEDED"
    logs = qk(stack, "logs", job_id, "--address", stack["dashboard"], "--no-follow").stdout
    assert f"{len(plan)} run(s) already finished in MLflow: skipped" in logs
    after = {r.info.run_id: len(client.get_metric_history(r.info.run_id, "train/loss")) for r in train_runs(client)}
    assert after == before
    assert [j["job_id"] for j in study_jobs(stack)] == [first_job, job_id]


def shared_files(stack: dict) -> list[str]:
    """Every file of the study on /shared (checkpoints, final weights) with its size."""
    find = ["find", f"/shared/qkstudy/{STUDY}", "-type", "f", "-printf", "%P %s\\n"]
    res = subprocess.run([stack["docker"], "exec", container(stack, "ray-head"), *find], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return sorted(res.stdout.splitlines())


def test_down_keeps_the_data_and_backup_purge_restore_gives_the_same_study(study) -> None:
    """Last in the module: `make backup`; `make stack-down` keeps the 4 volumes; `PURGE=1`
    deletes them; `make restore` then `make stack-up` (the module's second bring-up) serve the
    same report, the same runs and the same files on /shared (final weights included)."""
    stack, *_ = study
    env, env_file, docker, project = stack["make_env"], stack["env_file"], stack["docker"], stack["project"]
    out = stack["tmp"] / "report-restore"

    def report() -> list:
        res = qk(stack, "report", STUDY, "--tracking-uri", stack["mlflow"], "--out", str(out), "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        return json.loads(res.stdout)

    def runs() -> list:
        client = mlflow_client(stack)
        return sorted(
            (
                key(run_tags(r.data.tags)),
                r.info.status,
                r.data.metrics.get("tokens"),
                sorted(a.path for a in client.list_artifacts(r.info.run_id)),
            )
            for r in train_runs(client)
        )

    before, runs_before, files_before = report(), runs(), shared_files(stack)
    assert files_before  # checkpoints; the final weights are MLflow artifacts (runs())
    backup = stack["tmp"] / "backup"
    res = timed("make backup", run, ["make", "backup", f"BACKUP_DIR={backup}", f"ENV_FILE={env_file}"], env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.name for p in backup.iterdir()) == [
        "SHA256SUMS",
        "mlflow-artifacts.tar.gz",
        "mlflow-auth.tar.gz",
        "postgres.dump",
        "qkstudy-shared.tar.gz",
    ]
    res = timed("make stack-down (keep)", run, ["make", "stack-down", f"ENV_FILE={env_file}"], env=env, timeout=300)
    assert res.returncode == 0 and "volumes kept" in res.stdout, res.stdout + res.stderr
    left = project_objects(docker, project)
    assert left["containers"] == [] and left["networks"] == [] and len(left["volumes"]) == 4, left
    res = run(["make", "restore", f"BACKUP_DIR={backup}", f"ENV_FILE={env_file}"], env=env, timeout=300)
    assert res.returncode == 2 and "already has its volume" in res.stderr, res.stderr  # never over data
    res = timed("make stack-down PURGE=1 (mid)", run, ["make", "stack-down", "PURGE=1", f"ENV_FILE={env_file}"], env=env, timeout=300)
    assert res.returncode == 0 and project_objects(docker, project)["volumes"] == [], res.stdout + res.stderr
    res = timed("make restore", run, ["make", "restore", f"BACKUP_DIR={backup}", f"ENV_FILE={env_file}"], env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    res = timed(
        "make stack-up (restored)",
        run,
        ["make", "stack-up", f"ENV_FILE={env_file}"],
        env=env,
        timeout=1200,
        log=stack["tmp"] / "stack-up-2.log",
    )
    assert res.returncode == 0, res.stdout
    assert report() == before
    assert runs() == runs_before
    assert shared_files(stack) == files_before
