"""Data checks as code: Great Expectations suites run on a stage's output (or a sample of it).

A stage builds a list of :class:`Check` (an expectation plus whether it is critical), calls :func:`validate`
on a pandas frame and then :meth:`CheckReport.raise_for_critical`. The validation report is rendered as
Great Expectations Data Docs HTML into ``report_dir`` so the flow can keep it as an MLflow artifact.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


class DataCheckError(RuntimeError):
    """A critical expectation failed on a stage's output."""


@dataclass(frozen=True)
class Check:
    """One expectation (a ``great_expectations.expectations.*`` instance) and whether it is critical."""

    expectation: Any
    critical: bool = True

    @property
    def name(self) -> str:
        exp = self.expectation
        kwargs = {k: v for k, v in exp.configuration.kwargs.items() if k not in ("batch_id", "result_format")}
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        return f"{exp.expectation_type}({args})"


@dataclass
class CheckResult:
    name: str
    critical: bool
    success: bool
    observed: Any = None
    unexpected_count: int | None = None


@dataclass
class CheckReport:
    """Outcome of one suite on one frame."""

    suite: str
    rows: int
    results: list[CheckResult] = field(default_factory=list)
    report_dir: Path | None = None

    @property
    def success(self) -> bool:
        return all(r.success for r in self.results)

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.success]

    @property
    def failed_critical(self) -> list[CheckResult]:
        return [r for r in self.results if not r.success and r.critical]

    def summary(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "rows_checked": self.rows,
            "expectations": len(self.results),
            "failed": [r.name for r in self.failed],
            "failed_critical": [r.name for r in self.failed_critical],
        }

    def raise_for_critical(self) -> None:
        """Raise :class:`DataCheckError` naming every failed critical expectation."""
        bad = self.failed_critical
        if bad:
            lines = [
                f"  - {r.name}: observed {r.observed!r}"
                + (f", {r.unexpected_count} unexpected rows" if r.unexpected_count else "")
                for r in bad
            ]
            where = f" (report: {self.report_dir / 'index.html'})" if self.report_dir else ""
            raise DataCheckError(
                f"data check suite '{self.suite}' failed {len(bad)} critical expectation(s) on "
                f"{self.rows} rows{where}:\n" + "\n".join(lines)
            )


def validate(
    df, suite_name: str, checks: list[Check], report_dir: str | os.PathLike | None = None
) -> CheckReport:
    """Run ``checks`` on the pandas frame ``df``.

    Args:
        df: The rows to check (a sample when the output is large).
        suite_name: Name of the suite (shown in messages and in Data Docs).
        checks: Expectations with their criticality.
        report_dir: When given, Data Docs HTML for this validation is written there (``index.html``).

    Returns:
        A :class:`CheckReport`; call ``raise_for_critical()`` to fail the stage on critical failures.
    """
    import great_expectations as gx

    with contextlib.ExitStack() as stack:
        if report_dir is not None:
            project = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gx-")))
            ctx = gx.get_context(mode="file", project_root_dir=str(project))
        else:
            ctx = gx.get_context(mode="ephemeral")
        with contextlib.suppress(Exception):
            from great_expectations.data_context.types.base import ProgressBarsConfig

            ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
        uid = uuid.uuid4().hex[:8]
        source = ctx.data_sources.add_pandas(f"{suite_name}-{uid}")
        batch = source.add_dataframe_asset("output").add_batch_definition_whole_dataframe("whole")
        suite = ctx.suites.add(gx.ExpectationSuite(name=suite_name))
        for check in checks:
            check.expectation.meta = {**(check.expectation.meta or {}), "critical": check.critical}
            suite.add_expectation(check.expectation)
        vd = ctx.validation_definitions.add(
            gx.ValidationDefinition(name=f"{suite_name}-{uid}", data=batch, suite=suite)
        )
        actions = [gx.checkpoint.UpdateDataDocsAction(name="data_docs")] if report_dir is not None else []
        cp = ctx.checkpoints.add(
            gx.Checkpoint(
                name=f"cp-{uid}", validation_definitions=[vd], actions=actions, result_format="SUMMARY"
            )
        )
        run = cp.run(batch_parameters={"dataframe": df})
        report = CheckReport(suite=suite_name, rows=len(df))
        for vr in run.run_results.values():
            for r in vr.results:
                cfg = r.expectation_config
                res = r.result or {}
                check = next((c for c in checks if c.expectation.id == cfg.id), None)
                report.results.append(
                    CheckResult(
                        name=check.name if check else cfg.type,
                        critical=bool((cfg.meta or {}).get("critical", True)),
                        success=bool(r.success),
                        observed=res.get("observed_value", res.get("partial_unexpected_list")),
                        unexpected_count=res.get("unexpected_count"),
                    )
                )
        if report_dir is not None:
            site = project / "gx" / "uncommitted" / "data_docs" / "local_site"
            out = Path(report_dir)
            if out.exists():
                shutil.rmtree(out)
            shutil.copytree(site, out)
            report.report_dir = out
    return report
