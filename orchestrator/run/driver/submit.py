"""Submission to a remote Ray cluster through Ray's Job Submission API.

The job is ``python -m orchestrator.cli run SPEC`` executed on the cluster, in the image the
cluster's nodes run, with a ``working_dir`` that holds an allow-list and nothing else
(``driver.upload``: the code packages this process imports, the spec, its ``extends`` chain
and its local plug-ins, checked for credential-like names and size, staged, listed). Only
the spec's *path* and the command line's ``KEY=VALUE`` overrides enter the entrypoint (``run
SPEC KEY=VALUE ...``: the job merges them over the uploaded spec files exactly as ``submit``
did, so it trains the study ``submit`` validated), each quoted with ``shlex``; no spec field of
a file ever reaches a shell. Inside the job ``RAY_ADDRESS`` is set by Ray, so ``qkstudy run``
joins the cluster and schedules the runs there; resubmitting a study trains only the runs not
finished in its MLflow store.

Multi-node clusters need the study's ``tracking_uri`` to be an MLflow server and its
``storage_path`` (and QKSTUDY_CACHE for shards) on shared storage: a local SQLite file or
folder on one node is not visible from the others. A spec that leaves ``tracking_uri`` or
``storage_path`` to its defaults under a relative ``workdir`` is refused (``ephemeral_fields``):
those would live in the job's temporary copy of the working dir and vanish with it.

The address is the cluster's dashboard (the Job Submission API, ``http(s)://HOST:8265``):
``--address``, else ``RAY_API_SERVER_ADDRESS``, else ``RAY_ADDRESS``, the order of Ray's own
``ray job`` commands (``resolve_address``; unlike Ray, an explicit ``--address`` wins over
both). A Ray Client (``ray://``), GCS (``HOST:6379``) or ``auto`` address names the cluster,
not its dashboard, and is refused with what to pass instead (``not_a_dashboard``): Ray would
look the dashboard up through the cluster's GCS, a port a submitting machine seldom reaches.

After the job is sent, ``wait_job`` follows its logs to its end (Ctrl-C ends the following,
never the job) and ``stop_job`` stops one.

Two checks guard the trust boundary a job crosses. ``check_submit_address`` refuses to send
a job (code, and the user's authority over the cluster) over plain HTTP to anything but
loopback unless the user says ``--allow-insecure``. ``shell_join`` is the only way an argv
becomes the entrypoint string Ray runs through a shell: every element is quoted, so a path
such as ``$(rm -rf ~).yaml`` stays one literal argument.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shlex
import string
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from model.plugins import load_plugin, py_modules
from orchestrator.plan.overrides import spec_error
from orchestrator.plan.spec import Study, load_spec
from orchestrator.run.driver.upload import check_upload, staged, upload_entries, upload_plan
from orchestrator.track.lease import JOB_ID_ENV
from orchestrator.track.provenance import CODE_ROOT, SOURCE_ENV, submit_source
from orchestrator.track.tracking import redact_uri

# Forwarded to the job when set here: where shards are cached, the watchdog's bounds (no secrets).
FORWARDED_ENV = ("QKSTUDY_CACHE", "QKSTUDY_WATCHDOG")
AGENT_WAIT_S = 120
# Where the dashboard address comes from without --address, in the order Ray's job CLI reads them
# (ray.dashboard.utils.get_address_for_submission_client).
ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
# Ray's default GCS and Ray Client ports: HOST:PORT without a scheme on one of them names the cluster.
CLUSTER_PORTS = {"6379": "a GCS address (port 6379)", "10001": "a Ray Client address (port 10001)"}
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
STOP_WAIT_S = 60
# seconds an interrupted log follow waits for each step of closing its stream (follow_logs)
CLOSE_WAIT_S = 5


class AddressError(ValueError):
    """A job-submission address that cannot be used (the CLI exits with code 2)."""


class InsecureAddressError(AddressError):
    """A job-submission address would send the job unencrypted over a network."""


class UnknownJob(LookupError):
    """The cluster has no job of that id."""


def not_a_dashboard(address: str) -> str | None:
    """What ``address`` is when it names a Ray cluster rather than its dashboard, else None.

    ``auto`` / ``local`` (find a running Ray), ``ray://`` (the Ray Client) and a scheme-less
    ``HOST:6379`` / ``HOST:10001`` (Ray's default GCS and Ray Client ports) are what
    ``RAY_ADDRESS`` holds for ``ray.init`` (and ``qkstudy run``); the Job Submission API is
    the dashboard's http(s) URL. Any other port is taken for a dashboard: ``ray start --port``
    can move the GCS anywhere, which no address shows.
    """
    raw = address.strip()
    if raw.lower() in ("auto", "local"):
        return "ray.init's 'find a running Ray' address"
    if raw.lower().startswith("ray://"):
        return "a Ray Client address (scheme 'ray')"
    if "://" not in raw and (what := CLUSTER_PORTS.get(raw.rpartition(":")[2].rstrip("/"))):
        return what
    return None


def _refuse_cluster_address(address: str, label: str) -> None:
    """Raise AddressError when ``address`` (given as ``label``) names the cluster, not its dashboard."""
    if what := not_a_dashboard(address):
        raise AddressError(
            f"{label} {redact_uri(address.strip())!r} is {what}, not the Ray dashboard: the Job "
            "Submission API needs the dashboard's URL, http(s)://HOST:8265 (e.g. http://127.0.0.1:8265)"
        )


def resolve_address(address: str | None, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(the dashboard address, where it came from): ``address`` (``--address``) when given, else
    the first of ``RAY_API_SERVER_ADDRESS`` then ``RAY_ADDRESS`` that is set, the order of Ray's
    ``ray job`` commands. Ray lets either variable override an explicit address; here the
    command line wins. None when there is none.

    Raises:
        AddressError: the address names the cluster, not its dashboard (``not_a_dashboard``).
    """
    env = os.environ if environ is None else environ
    found = (address, "--address") if address else next(((env[k], k) for k in ADDRESS_ENV if env.get(k, "").strip()), None)
    if found is not None:
        _refuse_cluster_address(*found)
    return found


def require_address(address: str | None, environ: Mapping[str, str] | None = None) -> str:
    """``resolve_address``'s address; AddressError naming ``--address`` and both variables when none is given."""
    found = resolve_address(address, environ)
    if found is None:
        raise AddressError(
            "no Ray dashboard address: pass --address https://HOST:8265, or set RAY_API_SERVER_ADDRESS "
            "(or RAY_ADDRESS) to the dashboard's URL"
        )
    return found[0]


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IPs (127.0.0.0/8, ::1, IPv4-mapped 127.x).

    A hostname other than ``localhost`` is *not* resolved: DNS could point it anywhere.
    """
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def check_submit_address(address: str, *, allow_insecure: bool = False) -> str:
    """Validate and normalise a Ray Job Submission address (the dashboard URL, port 8265).

    Returns ``scheme://host[:port][/path]`` with scheme and host lower-cased and no trailing
    slash. An address without a scheme (``HOST:8265``) is read as ``http://`` (what Ray
    itself assumes) and then checked like one.

    Accepted: ``https://`` anywhere; ``http://`` to a loopback host (127.0.0.0/8, ::1,
    localhost), e.g. an SSH tunnel or ``docker compose`` on the same machine.

    Raises:
        InsecureAddressError: ``http://`` to a non-loopback host and ``allow_insecure`` is
            False (the job, its code and any auth header would travel in clear text).
        AddressError: empty or unparsable address, a Ray cluster's own address (``ray://``,
            ``auto``, ``HOST:6379``: ``not_a_dashboard``), a scheme other than http/https, a missing host,
            an invalid port, credentials embedded in the address (they would end up in logs:
            pass them as headers instead), or a query/fragment. No message holds a password.
    """
    if not isinstance(address, str) or not address.strip():
        raise AddressError("submit address is empty: expected e.g. https://ray-head.example:8265")
    raw = address.strip()
    if "://" not in raw:
        raw = "http://" + raw
    shown = redact_uri(raw)  # no message repeats a password
    _refuse_cluster_address(address, "submit address")
    try:
        parts = urlsplit(raw)
        port = parts.port  # parses and range-checks the port
    except ValueError as err:
        raise AddressError(f"submit address {shown!r} is not a valid URL: {err}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise AddressError(
            f"submit address {shown!r}: scheme {scheme!r} is not supported; the Ray Job "
            "Submission API is the dashboard URL, e.g. https://ray-head.example:8265"
        )
    host = parts.hostname
    if not host:
        raise AddressError(f"submit address {shown!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise AddressError(
            f"submit address {shown!r} embeds credentials; they would be logged. "
            "Pass authentication as request headers (RAY_JOB_HEADERS) instead"
        )
    if parts.query or parts.fragment:
        raise AddressError(f"submit address {shown!r} must not have a query or fragment")
    if any(ch.isspace() for ch in raw):
        raise AddressError(f"submit address {shown!r} contains whitespace")
    if scheme == "http" and not is_loopback_host(host) and not allow_insecure:
        raise InsecureAddressError(
            f"refusing to submit to {shown!r} over plain http: the job would cross the network "
            "unencrypted. Use https:// (TLS in front of the Ray dashboard), an SSH tunnel to "
            "http://127.0.0.1:8265, or pass --allow-insecure if this network is trusted"
        )
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), "", ""))


def shell_join(argv: Sequence[str]) -> str:
    """Quote an argv into one shell command line, for APIs that insist on a string.

    Ray's Job Submission API takes ``entrypoint`` as a string and runs it with a shell on
    the head node, so every element is quoted with `shlex.quote`: ``shlex.split`` of the
    result gives back `argv` exactly, and shell metacharacters (``$( )``, backticks, ``;``,
    ``|``, newlines) stay literal. Everywhere else launch processes with an argv list and
    never ``shell=True``.

    Raises:
        TypeError: `argv` is a string (almost always a bug) or holds a non-string element.
        ValueError: `argv` is empty or an element contains a NUL byte.
    """
    if isinstance(argv, (str, bytes)):
        raise TypeError("shell_join expects a list of arguments, not a single string")
    args = list(argv)
    if not args:
        raise ValueError("shell_join: empty argv")
    for i, arg in enumerate(args):
        if not isinstance(arg, str):
            raise TypeError(f"shell_join: argv[{i}] is {type(arg).__name__}, expected str")
        if "\x00" in arg:
            raise ValueError(f"shell_join: argv[{i}] contains a NUL byte")
    return shlex.join(args)


def ephemeral_fields(study: Study) -> list[tuple[str, str]]:
    """(field, message) for ``tracking_uri`` / ``storage_path`` left unset while ``workdir`` is
    unset or relative: their defaults would resolve inside the job's temporary working_dir copy
    on the head node, so the history and checkpoints would be lost and a resubmit finds nothing."""
    if study.workdir and Path(study.workdir).is_absolute():
        return []
    examples = {"tracking_uri": "http://mlflow:5000", "storage_path": f"/shared/qkstudy/{study.name}"}
    return [
        (
            name,
            f"not set: on a cluster it would default to a path inside the job's temporary working dir, "
            f"lost when the job ends; set it (e.g. {examples[name]}) or pass --allow-ephemeral",
        )
        for name in ("tracking_uri", "storage_path")
        if getattr(study, name) is None
    ]


def _checked_upload(spec_path: str | Path, study: Study, wd: Path, code_root: str | Path, runtime_env: dict[str, Any]) -> dict[str, Path]:
    """``upload_plan``'s files, with the spec's local plug-ins set as ``runtime_env["py_modules"]``
    (importable by name on every node of the job), all of it through ``check_upload``."""
    files = upload_plan(spec_path, study, wd, code_root)
    if local := py_modules([asdict(load_plugin(m)) for m in study.plugins]):  # loaded by load_spec
        runtime_env["py_modules"] = local
    check_upload([*files.items(), *upload_entries({"py_modules": local})], spec_path)
    return files


def build_job(
    spec_path: str | Path,
    address: str,
    *,
    allow_insecure: bool = False,
    allow_ephemeral: bool = False,
    working_dir: str | Path | None = None,
    upload: bool = True,
    overrides: Sequence[str] = (),
    code_root: str | Path = CODE_ROOT,
) -> dict[str, Any]:
    """The arguments of ``JobSubmissionClient.submit_job`` for a study, without sending them.

    Args:
        spec_path: the study spec; it must lie inside ``working_dir`` (its path relative to it
            is the one the job reads).
        address: the cluster's dashboard URL (``http://HOST:8265``).
        allow_ephemeral: submit even when ``ephemeral_fields`` finds state that would be lost.
        working_dir: the folder the spec's relative path (and its chain's) is taken from
            (default: the current one); it is not uploaded, only ``upload_plan``'s files are.
        upload: False when the cluster already has the code (its image) and reads the spec
            at the same absolute path (shared storage): nothing is uploaded.
        overrides: ``KEY=VALUE`` overrides of the spec (``orchestrator.plan.overrides``): set
            over it here to validate, and passed on to the job's ``run`` (and its metadata).
        code_root: the folder holding the code packages uploaded (default: the one this
            process imports them from, ``track.provenance.CODE_ROOT``).

    Returns:
        {"address", "entrypoint", "runtime_env", "metadata", "study", "submission_id",
        "upload"}: ``upload`` is ``upload_plan``'s {path in the job's working dir: local file}
        (empty with ``upload=False``); ``staged`` copies it into the folder Ray uploads as
        ``runtime_env["working_dir"]``. The job's id is chosen here (Ray's ``raysubmit_`` form)
        and set in the job's environment as ``QKSTUDY_RAY_JOB_ID``, so the study's lease names
        the job that holds it. With ``upload``, ``QKSTUDY_SOURCE`` in the job's environment
        holds ``code_root``'s git commit and dirty flag and the submitting user
        (``track.provenance.submit_source``), which the job's runs record.

    Raises:
        SpecError: the spec (with its overrides) does not validate, an override is malformed,
            the spec or a base lies outside the working dir, or (unless ``allow_ephemeral``)
            would keep its tracking store or checkpoints in the job's temporary working dir.
        UploadError: a file to upload looks like a credential, or the upload exceeds
            ``UPLOAD_MAX_BYTES`` (``check_upload``).
        AddressError: a bad address (see ``check_submit_address``).
    """
    study: Study = load_spec(spec_path, overrides)
    if not allow_ephemeral and (lost := ephemeral_fields(study)):
        raise spec_error(str(spec_path), lost, study.overrides)
    addr = check_submit_address(address, allow_insecure=allow_insecure)
    wd = Path(working_dir or os.getcwd()).resolve()
    runtime_env: dict[str, Any] = {}
    files = _checked_upload(spec_path, study, wd, code_root, runtime_env) if upload else {}
    rel = Path(spec_path).resolve().relative_to(wd) if upload else Path(spec_path).resolve()
    entrypoint = shell_join(["python", "-m", "orchestrator.cli", "run", rel.as_posix(), *study.overrides])
    overridden = {"overrides": redact_uri(shell_join(study.overrides))} if study.overrides else {}  # in the job's metadata too
    job_id = "raysubmit_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(16))
    from orchestrator.track.http_env import forwarded_http_env  # the cluster's workers retry MLflow as the driver does

    runtime_env["env_vars"] = {**forwarded_http_env(), **{k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}, JOB_ID_ENV: job_id}
    if upload:  # the upload has no .git: the code's commit and dirty flag are read here (track.provenance)
        runtime_env["env_vars"][SOURCE_ENV] = submit_source(code_root)
    return {
        "address": addr,
        "entrypoint": entrypoint,
        "runtime_env": runtime_env,
        "metadata": {"study": study.name, "spec": rel.as_posix(), **overridden},
        "study": study.name,
        "submission_id": job_id,
        "upload": files,
    }


def submit(
    spec_path: str | Path,
    address: str,
    *,
    allow_insecure: bool = False,
    allow_ephemeral: bool = False,
    working_dir: str | Path | None = None,
    upload: bool = True,
    overrides: Sequence[str] = (),
    before_send: Callable[[dict[str, Any]], object] | None = None,
) -> str:
    """Submit a study as a Ray job (see ``build_job``); returns the job's submission id.
    ``before_send`` sees the built job, its upload ``staged``, before anything leaves this
    machine (``qkstudy submit`` lists the upload with it)."""
    job = build_job(
        spec_path,
        address,
        allow_insecure=allow_insecure,
        allow_ephemeral=allow_ephemeral,
        working_dir=working_dir,
        upload=upload,
        overrides=overrides,
    )
    with staged(job):
        if before_send is not None:
            before_send(job)
        client = _client(job["address"], allow_insecure)
        # A cluster that just came up answers "No available agent" until its job agent is ready.
        deadline = time.time() + AGENT_WAIT_S
        while True:
            try:
                return client.submit_job(
                    entrypoint=job["entrypoint"],
                    runtime_env=job["runtime_env"],
                    metadata=job["metadata"],
                    submission_id=job["submission_id"],
                )
            except RuntimeError as e:
                if "No available agent" not in str(e) or time.time() > deadline:
                    raise
                time.sleep(2)


def _client(address: str, allow_insecure: bool = False):
    """Ray's Job Submission client of ``address``, checked by ``check_submit_address``."""
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(check_submit_address(address, allow_insecure=allow_insecure))


def _job_info(client, job_id: str) -> tuple[str, str | None]:
    """(status, message) of a job; UnknownJob when the cluster has no job of that id (Ray answers 404)."""
    try:
        info = client.get_job_info(job_id)
    except RuntimeError as e:
        if "status code 404" not in str(e):
            raise
        raise UnknownJob(
            f"no job {job_id!r} on {redact_uri(client.get_address())} (`qkstudy status STUDY --address URL` lists a study's jobs)"
        ) from None
    return str(info.status.value), info.message


def job_status(address: str, job_id: str, *, allow_insecure: bool = False) -> str:
    """Ray's status of a job (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED)."""
    return _job_info(_client(address, allow_insecure), job_id)[0]


def study_jobs(address: str, study: str, *, allow_insecure: bool = False) -> list[dict[str, Any]]:
    """The cluster's jobs submitted for ``study`` (from their metadata), newest last."""
    jobs = [j for j in _client(address, allow_insecure).list_jobs() if (j.metadata or {}).get("study") == study]
    jobs.sort(key=lambda j: j.start_time or 0)
    return [
        {"job_id": j.submission_id, "status": str(j.status.value), "start_time": j.start_time, "end_time": j.end_time, "message": j.message}
        for j in jobs
    ]


def follow_logs(address: str, job_id: str, *, follow: bool = True, allow_insecure: bool = False) -> Iterator[str]:
    """Yield a job's log text: everything so far, then (``follow``) new lines until it ends.
    A KeyboardInterrupt ends the following (the stream is closed, the job keeps running)."""
    import asyncio

    client = _client(address, allow_insecure)
    if not follow:
        yield client.get_job_logs(job_id)
        return

    loop = asyncio.new_event_loop()
    agen = client.tail_job_logs(job_id)
    try:
        while True:
            try:
                yield loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:  # interrupted mid-read: end the read, then the stream, before the loop. Each step is
        # bounded: a dashboard slow to answer the websocket's close must not hold Ctrl-C up.
        if pending := asyncio.all_tasks(loop):
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.wait(pending, timeout=CLOSE_WAIT_S))
        # Interrupted between reads, the stream waits at its yield. The loop does not know it
        # (its first read began outside the running loop, so shutdown_asyncgens skips it): close
        # it here, or the garbage collector would, with no loop to close its session in. Still
        # running (a read that outlived its cancel) it cannot be closed and is left.
        with contextlib.suppress(TimeoutError, RuntimeError):
            loop.run_until_complete(asyncio.wait_for(agen.aclose(), CLOSE_WAIT_S))
        loop.close()


def wait_job(
    address: str, job_id: str, write: Callable[[str], object], *, allow_insecure: bool = False, settle_s: float = 30
) -> tuple[str, str | None]:
    """Follow a job's logs into ``write`` until it ends, as ``ray job submit`` does; returns its
    final (status, message). Ray closes the log stream when the job ends and may record the
    status a moment later: it is read until it is final, for up to ``settle_s`` seconds (a
    status still PENDING or RUNNING after that means the stream broke off early)."""
    for chunk in follow_logs(address, job_id, allow_insecure=allow_insecure):
        write(chunk)
    client = _client(address, allow_insecure)
    deadline = time.monotonic() + settle_s
    while (info := _job_info(client, job_id))[0] not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.5)
    return info


def stop_job(address: str, job_id: str, *, allow_insecure: bool = False, wait_s: float = STOP_WAIT_S) -> tuple[bool, str]:
    """Stop a job with Ray's ``stop_job`` (SIGTERM to its entrypoint, SIGKILL after Ray's grace
    period) and wait up to ``wait_s`` for it to end. Returns (whether it was still running, its
    status then). The study's finished runs stay finished; a resubmit trains the rest.

    Raises:
        UnknownJob: the cluster has no job ``job_id``.
    """
    client = _client(address, allow_insecure)
    status, _ = _job_info(client, job_id)
    if status in TERMINAL or not client.stop_job(job_id):  # stop_job: False when it had already ended
        return False, _job_info(client, job_id)[0]
    deadline = time.monotonic() + wait_s
    while status not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.5)
        status, _ = _job_info(client, job_id)
    return True, status
