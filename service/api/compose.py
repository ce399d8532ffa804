"""Compose import preflight (frozen): matrix evaluation and a report. Deploys and stores nothing."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..authz.input import compose_value
from ..chain import Outcome, Run, Target, protected
from ..compose import preflight
from ..compose.evaluator import COMPOSE_EVALUATOR, COMPOSE_RULES, EvaluationFailed
from ..compose.preflight import ComposeTooLarge, EvaluationBudgetExceeded, check_budget
from ..config import CONFIG
from ..errors import ComposeTooLarge as ComposeTooLargeProblem
from ..errors import EvaluationBudgetExceeded as EvaluationBudgetProblem
from ..errors import EvaluationFailed as EvaluationFailedProblem

routes = web.RouteTableDef()


async def _target(request: web.Request, body: Any) -> Target:
    env = body.get("env") or request.app[CONFIG].environments.strictest()
    # The fields are the resource: the audit record's resource hash names exactly what was checked.
    # The policy sees a summary of them (``compose_value``: no environment maps or labels).
    return Target(resource=body["fields"], env=env, value=compose_value(body["fields"]))


@routes.post("/api/v1/compose/import")
@protected("compose.import", target=_target, body="compose-import.schema.json")
async def compose_import(run: Run) -> Outcome:
    """200 with the report, also when ``passed`` is false."""
    body = run.body
    try:
        check_budget(body["fields"])  # on the loop: a count, before any evaluation
    except ComposeTooLarge as exc:
        raise ComposeTooLargeProblem(
            exc.message, code="compose_too_large",
            errors=[{"pointer": exc.pointer, "message": exc.message}]) from None
    # In an evaluator process (a native crash there fails this request only), in chunks of
    # services with the preflight's time budget checked between them; a cached report is
    # answered here.
    budget_s = preflight.EVALUATION_BUDGET_S
    try:
        report, text = await run.request.app[COMPOSE_EVALUATOR].evaluate_json(
            body["fields"],
            strict=bool(body.get("strict", False)),
            env=body.get("env"),
            rules=run.request.app[COMPOSE_RULES],
            environments=run.request.app[CONFIG].environments,
            budget_s=budget_s,
        )
    except EvaluationBudgetExceeded as exc:
        raise EvaluationBudgetProblem(
            exc.message, code="evaluation_budget_exceeded",
            errors=[{"pointer": "/fields/services", "message": exc.message}]) from None
    except EvaluationFailed as exc:
        raise EvaluationFailedProblem(
            exc.message, code="evaluation_failed",
            errors=[{"pointer": "/fields", "message": exc.message}]) from None
    # The report's JSON text is cached with it: a repeated file serialises nothing.
    return Outcome(200, report, text=text,
                   audit={"compose_passed": report["passed"],
                          "compose_revision": report.get("policy_revision")})
