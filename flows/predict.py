"""Batch prediction with a registered model over a JSON Lines file: ``python -m flows.predict``.

Models, file formats, Prefect and exit codes: docs/serving.md ("Batch prediction").
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

from prefect import flow
from pydantic import Field

from bert_core.serving.batch import DEFAULT_BATCH_SIZE, DEFAULT_ID_FIELD, predict_file
from flows._cli import quiet_refusals, run_command
from flows._stage import in_repo, library_logs


@flow(name="predict", log_prints=True, retries=0, validate_parameters=True)
def predict_flow(
    input_path: str,
    output_path: str,
    model: str = "models:/bert-sst2@champion",
    batch_size: Annotated[int, Field(ge=1, le=65536)] = DEFAULT_BATCH_SIZE,
    id_field: str = DEFAULT_ID_FIELD,
    restart: bool = False,
) -> dict[str, Any]:
    """Predict every row of a JSON Lines file with a registered model; write the predictions as JSON Lines.

    Args:
        input_path: JSON Lines file, one object per line with the model's input fields (relative paths are
            relative to the repository), e.g. data/predict/in.jsonl.
        output_path: Where the predictions go (one JSON object per input row, same order); written only
            when every row was predicted. A run that stopped keeps its rows beside it, and the next run of
            the same input, model and settings continues after them.
        model: models:/<name>@<alias>, models:/<name>/<version>, runs:/<run>/model, an MLflow Model
            directory, or a stage's model directory (models/finetuned/sst2, models/pretrained; relative
            paths are relative to the repository).
        batch_size: Rows per model call.
        id_field: Input field copied to each output row (when the row has it).
        restart: Predict every row again, dropping the rows an unfinished earlier run kept.

    Returns:
        model_uri, input, output, rows, blank_lines, seconds, predict_seconds, rows_per_second,
        resumed_rows.
    """
    with library_logs():  # progress on the console and in the run's logs (Prefect's root is at WARNING)
        result = predict_file(
            _model_path(model),
            in_repo(input_path, "input_path"),
            in_repo(output_path, "output_path"),
            batch_size=batch_size,
            id_field=id_field,
            restart=restart,
        )
    return result.as_record()


def _model_path(model: str) -> str:
    """``model`` as given, or, when it names a directory relative to the repository, its absolute path."""
    if "://" in model or model.startswith(("models:/", "runs:/")) or Path(model).expanduser().is_absolute():
        return model
    local = in_repo(model, "model")
    return str(local) if local.is_dir() else model


def _prefect_settings(no_prefect: bool) -> contextlib.AbstractContextManager[Any] | None:
    """Settings to run as a Prefect flow run, or ``None`` to run directly (no server to report to)."""
    if no_prefect:
        return None
    if url := os.environ.get("PREFECT_API_URL"):
        from flows._prefect_api import check_api

        check_api(url, advice="Start that server, fix or unset PREFECT_API_URL, or run with --no-prefect.")
        return contextlib.nullcontext()
    from flows._served import served_api_url

    url = served_api_url()
    if not url:
        return None
    from prefect.settings import PREFECT_API_URL, temporary_settings

    print(f"reporting to the Prefect server of `make serve` at {url}", file=sys.stderr)
    return temporary_settings(updates={PREFECT_API_URL: url})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.predict", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        required=True,
        help="models:/bert-sst2@champion, an MLflow Model directory, or a stage's model directory "
        "(models/finetuned/sst2, models/pretrained)",
    )
    parser.add_argument("--input", required=True, help="JSON Lines input, one object per line")
    parser.add_argument(
        "--output", required=True, help="JSON Lines output, .jsonl or .ndjson (written atomically)"
    )
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="rows per model call")
    parser.add_argument("--id-field", default=DEFAULT_ID_FIELD, help="input field copied to each output row")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="predict every row, dropping the rows an unfinished earlier run of this output kept",
    )
    parser.add_argument("--no-prefect", action="store_true", help="run directly, not as a Prefect flow run")
    args = parser.parse_args(argv)
    model = Path(args.model).expanduser()
    kwargs = {
        "input_path": str(Path(args.input).expanduser().resolve()),
        "output_path": str(Path(args.output).expanduser().resolve()),
        "model": str(model.resolve()) if model.is_dir() else args.model,
        "batch_size": args.batch_size,
        "id_field": args.id_field,
        "restart": args.restart,
    }

    def body() -> None:
        settings = _prefect_settings(args.no_prefect)
        if settings is None:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
            result = predict_flow.fn(**kwargs)
        else:
            quiet_refusals()
            with settings:
                result = predict_flow(**kwargs)
        rows, seconds, output = result["rows"], result["seconds"], result["output"]
        earlier = f" ({result['resumed_rows']} by an earlier run)" if result["resumed_rows"] else ""
        print(f"predicted {rows} row(s){earlier} in {seconds:.1f}s -> {output}", file=sys.stderr)

    return run_command(body, "predict", after_stop="; the output was not written")


if __name__ == "__main__":
    sys.exit(main())
