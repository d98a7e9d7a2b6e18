"""Run the GPU stages on another machine: deployments on a Prefect work pool and the worker that runs them.

``python -m flows.pool deploy|worker --pool gpu`` (``make deploy`` / ``make worker``): docs/work-pools.md.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from pathlib import Path
from typing import Any

from bert_core.constants import REPO_ROOT

POOL_ENV = "BERT_WORK_POOL"
DEFAULT_POOL = "bert-cpu"
POOL_TYPE = "process"
_URL_HINT = "e.g. http://ui-host:4200/api for the host that runs `make serve`"
_POOL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

#: The flows deployed to a pool: module entrypoint -> what it runs.
POOL_FLOWS = {
    "flows.pipeline.pipeline_flow": "The whole pipeline through DVC (dvc exp run)",
    "flows.pretrain.pretrain_flow": "Pretraining on its own (outside DVC)",
    "flows.finetune.finetune_flow": "Fine-tuning one task on its own (outside DVC)",
}

#: The pull step every pool deployment runs before its flow is imported.
PULL_STEP = {"flows.pool.enter_checkout": {}}


class PoolError(RuntimeError):
    """The pool, the Prefect API or the worker's settings are not usable; the message says what to do."""


def pool_name(value: str | None = None) -> str:
    """``value``, else ``$BERT_WORK_POOL``, else :data:`DEFAULT_POOL`; checked to be a usable name."""
    name = (value or os.environ.get(POOL_ENV) or DEFAULT_POOL).strip()
    if not _POOL_NAME_RE.match(name):
        raise PoolError(
            f"work pool name {name!r}: use letters, digits, '.', '_' and '-' (at most 63), e.g. POOL=gpu"
        )
    return name


def enter_checkout() -> dict[str, str]:
    """Pull step of the pool deployments: move the flow run (started in a temporary directory) into the
    checkout whose code it imports, as the stage defaults (``params/...``) are relative to it."""
    if not (REPO_ROOT / "dvc.yaml").is_file():
        raise PoolError(
            f"{REPO_ROOT} (where this flow run's code was imported from) is not a checkout of the pipeline: "
            "no dvc.yaml. Start the worker with `make worker POOL=<pool>` in the checkout that should run it."
        )
    os.chdir(REPO_ROOT)
    return {"directory": str(REPO_ROOT)}


def build_deployments(pool: str) -> list[Any]:
    """The :data:`POOL_FLOWS` as deployments named ``<flow>/<pool>`` on work pool ``pool``."""
    from prefect import Flow
    from prefect.deployments.runner import EntrypointType
    from prefect.runner.storage import LocalStorage
    from prefect.utilities.importtools import import_object

    class WorkerCheckout(LocalStorage):
        """The worker's own checkout: nothing to copy, and :data:`PULL_STEP` instead of a fixed directory."""

        def to_pull_step(self) -> list[dict[str, Any]]:  # type: ignore[override]
            return [dict(PULL_STEP)]

    deployments = []
    for entrypoint, what in POOL_FLOWS.items():
        flow = import_object(entrypoint)
        if not isinstance(flow, Flow):
            raise PoolError(f"{entrypoint} is not a Prefect flow")
        deployment = flow.to_deployment(
            name=pool,
            work_pool_name=pool,
            description=f"{what}, on a worker of pool {pool}.",
            tags=["bert", f"pool:{pool}"],
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        # The module attribute itself: the flow's function may be wrapped (finetune) or built lazily (pretrain).
        deployment.entrypoint = entrypoint
        deployment.storage = WorkerCheckout(str(REPO_ROOT))
        deployments.append(deployment)
    return deployments


def resolve_api() -> str:
    """``PREFECT_API_URL`` (checked), else the API of this checkout's ``make serve``, else :class:`PoolError`."""
    from prefect.settings import PREFECT_API_URL

    from flows._prefect_api import PrefectApiUnreachable, check_api
    from flows._served import served_api_url

    if url := (os.environ.get("PREFECT_API_URL") or PREFECT_API_URL.value() or "").strip():  # or the profile
        try:
            check_api(
                url, advice=f"Start the server there (`make serve`) or fix PREFECT_API_URL ({_URL_HINT})."
            )
        except PrefectApiUnreachable as err:
            raise PoolError(str(err)) from None
        return url
    if url := served_api_url():
        return url
    raise PoolError(
        f"no Prefect server to talk to: set PREFECT_API_URL to the team's server ({_URL_HINT}), or start "
        "`make serve` in this checkout first"
    )


def ensure_pool(client: Any, pool: str) -> bool:
    """Create work pool ``pool`` (type process) unless it exists; ``True`` when it was created."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    try:
        existing = client.read_work_pool(pool)
    except ObjectNotFound:
        template = ProcessWorker.get_default_base_job_template()
        client.create_work_pool(WorkPoolCreate(name=pool, type=POOL_TYPE, base_job_template=template))
        return True
    if existing.type != POOL_TYPE:
        raise PoolError(
            f"work pool {pool!r} exists with type {existing.type!r}; these deployments need a {POOL_TYPE!r} "
            "pool (the worker runs flows from its checkout): pick another POOL name"
        )
    return False


def deploy(pool: str) -> list[str]:
    """Create the pool if missing and register the deployments on it; returns their names."""
    api = resolve_api()
    os.environ["PREFECT_API_URL"] = api
    from prefect.client.orchestration import get_client
    from prefect.deployments.runner import DeploymentApplyError
    from prefect.exceptions import PrefectHTTPStatusError
    from prefect.settings import PREFECT_API_URL, temporary_settings

    names = []
    with temporary_settings(updates={PREFECT_API_URL: api}):
        try:
            with get_client(sync_client=True) as client:
                created = ensure_pool(client, pool)
            print(f"work pool {pool!r} ({POOL_TYPE}) {'created' if created else 'exists'} on {api}")
            for deployment in build_deployments(pool):
                deployment.apply(work_pool_name=pool)
                names.append(f"{deployment.flow_name}/{deployment.name}")
                print(f"deployed {names[-1]}  ({deployment.entrypoint})")
        except (DeploymentApplyError, PrefectHTTPStatusError) as err:
            done = f" (deployed so far: {', '.join(names)})" if names else ""
            raise PoolError(f"the Prefect server at {api} refused: {err}{done}") from None
    print(f"start a worker on the machine that should run them, in its checkout: make worker POOL={pool}")
    return names


def worker_env(api: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The worker's environment (its flow runs inherit it): this checkout's code first, the API settled,
    ``MLFLOW_TRACKING_URI`` and ``BERT_DATA_ROOT`` checked."""
    from bert_core.tracking import TrackingUnavailable
    from bert_core.tracking.run import check_tracking_server
    from flows import TELEMETRY_OFF

    env = dict(os.environ if base is None else base)
    for key, value in TELEMETRY_OFF.items():
        env.setdefault(key, value)
    env["PREFECT_API_URL"] = api
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *paths])
    env.setdefault("PYTHONUNBUFFERED", "1")
    if uri := env.get("MLFLOW_TRACKING_URI", "").strip():
        try:
            check_tracking_server(uri)
        except TrackingUnavailable as err:
            raise PoolError(str(err)) from None
    if root := env.get("BERT_DATA_ROOT", "").strip():
        path = (REPO_ROOT / Path(root).expanduser()).resolve()
        if not path.is_dir():
            raise PoolError(
                f"BERT_DATA_ROOT={root!r} is not a directory on this machine ({path}): point it at a data "
                "root laid out like shared/data, or unset it to load sources from the Hugging Face Hub"
            )
        env["BERT_DATA_ROOT"] = str(path)
    return env


def worker_command(pool: str, limit: int, name: str | None = None) -> list[str]:
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", POOL_TYPE]
    command += ["--limit", str(limit), "--install-policy", "never"]
    return [*command, "--name", name] if name else command


def worker(pool: str, limit: int = 1, name: str | None = None) -> None:
    """Check the settings, say what the worker will do, then become ``prefect worker start``."""
    from bert_core.tracking.run import redact_uri, tracking_uri

    api = resolve_api()
    env = worker_env(api)
    mlflow_uri = env.get("MLFLOW_TRACKING_URI") or ""
    unset = f"{tracking_uri()}  (MLFLOW_TRACKING_URI unset: this checkout only; set it to the team's server)"
    shown_mlflow = redact_uri(mlflow_uri) if mlflow_uri else unset
    lines = [
        f"worker for work pool {pool!r} ({POOL_TYPE}) on {socket.gethostname()}, {limit} flow run(s) at a time",
        f"  Prefect API   {api}",
        f"  checkout      {REPO_ROOT}  (flow runs import their code and write their outputs here)",
        f"  MLflow        {shown_mlflow}",
        f"  data root     {env.get('BERT_DATA_ROOT') or '(BERT_DATA_ROOT unset: sources load from the Hub)'}",
    ]
    print("\n".join(lines), flush=True)
    command = worker_command(pool, limit, name)
    print("running: " + " ".join(command[1:]), flush=True)
    os.chdir(REPO_ROOT)
    os.execve(command[0], command, env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.pool", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command, text in (
        ("deploy", "create the pool if missing and register bert-pipeline, pretrain and finetune on it"),
        ("worker", "run what is triggered on the pool from this checkout (prefect worker start)"),
    ):
        p = sub.add_parser(command, help=text)
        p.add_argument("--pool", default=None, help=f"work pool name (default ${POOL_ENV} or {DEFAULT_POOL})")
        if command == "worker":
            p.add_argument("--limit", type=int, default=1, help="flow runs at a time (default 1)")
            p.add_argument("--name", default=None, help="worker name (default: Prefect's)")
    args = parser.parse_args(argv)
    try:
        pool = pool_name(args.pool)
        if args.command == "deploy":
            deploy(pool)
        else:
            if args.limit < 1:
                raise PoolError(f"--limit {args.limit}: give at least 1")
            worker(pool, args.limit, args.name)
    except PoolError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
