"""Run the GPU stages on another machine: deployments on a Prefect work pool and the worker that runs them.

Teams keep the UI and tracking on one machine (``make serve``, ``make ui`` or a team MLflow server) and run
the heavy flows on another (a GPU box). This module makes that path two commands::

    python -m flows.pool deploy --pool gpu   # anywhere: the pool (type process) + three deployments
    python -m flows.pool worker --pool gpu   # on the GPU machine, in its checkout: runs what is triggered

(``make deploy POOL=gpu`` and ``make worker POOL=gpu``; the pool name defaults to ``$BERT_WORK_POOL`` or
``bert-cpu``.) ``deploy`` creates the pool when it is missing and registers, on it,
``bert-pipeline/<pool>`` (the whole pipeline through DVC), ``pretrain/<pool>`` and ``finetune/<pool>``
(the stage flows on their own, outside DVC). Their parameters are the UI's run form, as for
``make serve``'s ``*/local`` deployments.

The worker runs flows from **its own checkout**: the deployments carry no code, only a module entrypoint
(``flows.pipeline.pipeline_flow`` ...) and one pull step, :func:`enter_checkout`, which makes the flow
run work in the checkout whose code it imports (the worker puts its checkout first on ``PYTHONPATH``). So
the GPU machine needs a clone at the same commit with ``make venv`` done and its data in place (``dvc
pull`` or ``BERT_DATA_ROOT``); outputs (``models/``, ``results/``, ``metrics/``) land in that clone, and
MLflow runs and registered models in ``MLFLOW_TRACKING_URI`` (the team's server).

The Prefect API is ``PREFECT_API_URL`` (checked first: one that does not answer is an error within
seconds), else the server of ``make serve`` serving this checkout; with neither, both commands stop and
say what to set. The worker also checks ``MLFLOW_TRACKING_URI`` and ``BERT_DATA_ROOT`` before it starts,
prints where its runs will report, then becomes ``prefect worker start --pool <pool> --type process``
(one flow run at a time by default: a GPU machine trains one model at a time).
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

#: The flows deployed to a pool: (module entrypoint, description). Each entrypoint names a Prefect flow at
#: module level (``flows.pretrain.pretrain_flow`` is built on first access, see that module).
POOL_FLOWS = (
    (
        "flows.pipeline.pipeline_flow",
        "The whole pipeline through DVC (dvc exp run), on a worker of pool {pool}.",
    ),
    ("flows.pretrain.pretrain_flow", "Pretraining on its own (outside DVC), on a worker of pool {pool}."),
    (
        "flows.finetune.finetune_flow",
        "Fine-tuning one task on its own (outside DVC), on a worker of pool {pool}.",
    ),
)

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
    """Pull step of the pool deployments: work in the checkout whose code this flow run imports.

    Runs in the flow-run process a worker starts (in a temporary directory), before the flow is imported.
    The stage defaults (``params/...``, ``data/...``) are relative to the repository, so the run moves there.

    Raises:
        PoolError: the imported code does not sit in a checkout of this project (no ``dvc.yaml``).
    """
    if not (REPO_ROOT / "dvc.yaml").is_file():
        raise PoolError(
            f"{REPO_ROOT} (where this flow run's code was imported from) is not a checkout of the pipeline: "
            "no dvc.yaml. Start the worker with `make worker POOL=<pool>` in the checkout that should run it."
        )
    os.chdir(REPO_ROOT)
    return {"directory": str(REPO_ROOT)}


class WorkerCheckout:
    """Deployment storage meaning "the worker's own checkout": nothing to upload or download, one pull step.

    Implements Prefect's ``RunnerStorage`` protocol, which is how a deployment gets its pull steps.
    """

    def set_base_path(self, path: Path) -> None:  # the code is never copied anywhere
        pass

    @property
    def pull_interval(self) -> int | None:
        return None

    @property
    def destination(self) -> Path:
        return REPO_ROOT

    async def pull_code(self) -> None:
        pass

    def to_pull_step(self) -> list[dict[str, Any]]:
        return [dict(PULL_STEP)]

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, WorkerCheckout)

    __hash__ = object.__hash__


def build_deployments(pool: str) -> list[Any]:
    """The :data:`POOL_FLOWS` as deployments named ``<flow>/<pool>`` on work pool ``pool``."""
    from prefect import Flow
    from prefect.deployments.runner import EntrypointType
    from prefect.utilities.importtools import import_object

    deployments = []
    for entrypoint, description in POOL_FLOWS:
        flow = import_object(entrypoint)
        if not isinstance(flow, Flow):
            raise PoolError(f"{entrypoint} is not a Prefect flow")
        deployment = flow.to_deployment(
            name=pool,
            work_pool_name=pool,
            description=description.format(pool=pool),
            tags=["bert", f"pool:{pool}"],
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        # The module attribute itself: the flow's function may be wrapped (finetune) or built lazily (pretrain).
        deployment.entrypoint = entrypoint
        deployment.storage = WorkerCheckout()
        deployments.append(deployment)
    return deployments


def resolve_api(home: Path | None = None) -> str:
    """The Prefect API the commands talk to: ``PREFECT_API_URL`` (checked), else this checkout's ``make serve``.

    Raises:
        PoolError: the API does not answer, or none is set and no ``make serve`` serves this checkout.
    """
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
    home = home or Path(os.environ.get("PREFECT_HOME") or REPO_ROOT / ".prefect")
    if url := served_api_url(home):
        return url
    raise PoolError(
        f"no Prefect server to talk to: set PREFECT_API_URL to the team's server ({_URL_HINT}), or start "
        "`make serve` in this checkout first"
    )


def ensure_pool(client: Any, pool: str) -> bool:
    """Create work pool ``pool`` (type process) unless it exists; ``True`` when it was created.

    Raises:
        PoolError: a pool of that name exists with another type.
    """
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
    """The worker's environment (its flow runs inherit it): this checkout's code first, the API settled.

    Raises:
        PoolError: ``MLFLOW_TRACKING_URI`` names a server that does not answer, or ``BERT_DATA_ROOT`` is
            not a directory.
    """
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
    for command in ("deploy", "worker"):
        p = sub.add_parser(command)
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
