"""Prefect flows: one thin flow per pipeline stage (``python -m flows.<stage>``) plus the pipeline itself.

Defaults set here, before any flow module imports Prefect or torch: telemetry off, ``bert_core`` log lines
shown in the Prefect UI, no MLflow artifact progress bars in the stage logs, a startup timeout that survives
the first database migration of a fresh Prefect home, and OpenMP threads that wait passively: the pipeline
runs stages side by side on a CPU's cores, and OpenMP's default spinning wait then made a tiny-model training
step 5-7x slower (973 ms against 143 ms with 2 threads), while a passive wait costs little on an idle
machine. ``OMP_WAIT_POLICY=ACTIVE`` overrides it.
"""

import os

TELEMETRY_OFF = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "GX_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
}

for _key, _value in {
    **TELEMETRY_OFF,
    "PREFECT_LOGGING_EXTRA_LOGGERS": "bert_core",
    # bert_core logs outside flow runs too (tests, plain scripts): no warning per record there.
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "OMP_WAIT_POLICY": "PASSIVE",
    # A registration reads back the model it has just logged, with two progress bars that say nothing.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}.items():
    os.environ.setdefault(_key, _value)
