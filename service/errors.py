"""RFC 9457 problem details: the error tree, and the one place errors become HTTP responses.

Problem                              status  code
├── BadRequest                       400     bad_request
│   └── MalformedJSON                400     malformed_json
├── Unauthorized                     401     unauthenticated
│   └── StepUpRequired               401     step_up_required   (+ RFC 9470 WWW-Authenticate)
├── Forbidden                        403     forbidden
│   ├── PolicyDenied                 403     denied
│   ├── ApprovalRequired             403     approval_required  (+ the bindings a ticket needs)
│   └── TicketBindingMismatch        403     ticket_binding_mismatch
├── NotFound                         404     not_found
├── MethodNotAllowed                 405     method_not_allowed (+ Allow)
├── Conflict                         409     conflict (ticket_consumed, ticket_expired, ...)
├── Gone                             410     gone
│   └── LegacyOnly                   410     legacy_only
├── PayloadTooLarge                  413     payload_too_large
├── UnsupportedMediaType             415     unsupported_media_type
├── SchemaValidationFailed           422     schema_validation_failed (+ errors: [{pointer, message}])
│   ├── JSONTooDeep                  422     too_deep        (service.limits: nesting)
│   ├── JSONTooLarge                 422     too_large       (service.limits: one value's size)
│   ├── InvalidString                422     invalid_string  (U+0000, an unpaired surrogate)
│   ├── InvalidNumber                422     invalid_number  (outside I-JSON)
│   ├── ComposeTooLarge              422     compose_too_large (over the compose size budget)
│   ├── EvaluationBudgetExceeded     422     evaluation_budget_exceeded (compose time budget)
│   └── EvaluationFailed             422     evaluation_failed (the compose evaluator process died)
├── TooManyRequests                  429     rate_limited (+ Retry-After)
│   └── TooManyStreams               429     too_many_streams (+ Retry-After)
├── RequestHeaderFieldsTooLarge      431     header_fields_too_large (answered by the HTTP edge)
├── InternalError                    500     internal_error
└── ServiceUnavailable               503     service_unavailable (store_unavailable, ...)
    ├── ApprovalRepositoryUnavailable 503    approval_repository_unavailable
    └── OutcomeUnknown               503     outcome_unknown (may have executed; + how to check)

Every body carries ``type``, ``title``, ``status``, ``detail``, ``code`` and ``correlation_id``.
``detail`` is written for people and never contains exception text from a library, a path, a DSN
or a secret; an unexpected exception becomes a 500 whose body says only the correlation id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

import rfc8785
from aiohttp import web

from . import limits
from .schemas import ValidationFailed

__all__ = [
    "PROBLEM_CONTENT_TYPE",
    "ApprovalRepositoryUnavailable",
    "ApprovalRequired",
    "BadRequest",
    "ComposeTooLarge",
    "Conflict",
    "EvaluationBudgetExceeded",
    "EvaluationFailed",
    "Forbidden",
    "Gone",
    "InternalError",
    "InvalidNumber",
    "InvalidString",
    "JSONTooDeep",
    "JSONTooLarge",
    "LegacyOnly",
    "MalformedJSON",
    "MethodNotAllowed",
    "NotFound",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "PolicyDenied",
    "Problem",
    "RequestHeaderFieldsTooLarge",
    "SchemaValidationFailed",
    "ServiceUnavailable",
    "StepUpRequired",
    "TicketBindingMismatch",
    "TooManyRequests",
    "TooManyStreams",
    "Unauthorized",
    "UnsupportedMediaType",
    "problem_response",
    "to_problem",
]

PROBLEM_CONTENT_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:controlplane:problem:"


class Problem(Exception):
    """An error with an HTTP meaning. Subclasses set ``status``, ``code`` and ``title``."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    title: ClassVar[str] = "Internal Server Error"

    def __init__(
        self,
        detail: str | None = None,
        *,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        **extensions: Any,
    ):
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.instance_code = code or self.code
        self.headers = dict(headers or {})
        self.extensions = extensions

    def body(self, correlation_id: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": TYPE_PREFIX + self.instance_code,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.instance_code,
            "correlation_id": correlation_id,
        }
        for key, value in self.extensions.items():
            body.setdefault(key, value)
        return body


class BadRequest(Problem):
    """A request the service cannot read (aiohttp's own 400s); more specific 400s name their
    ``code`` (``invalid_ticket_headers``, ``invalid_command_hash``, ...)."""

    status, code, title = 400, "bad_request", "Bad Request"


class MalformedJSON(BadRequest):
    """The body is not a JSON document (syntax, encoding, duplicate keys, NaN, nesting, empty)."""

    code, title = "malformed_json", "Malformed JSON"


class Unauthorized(Problem):
    """Missing or rejected credentials, with a Bearer ``WWW-Authenticate`` challenge; the
    ``code`` says why (``invalid_credentials``, ``token_*``, ``session_*``, ...)."""

    status, code, title = 401, "unauthenticated", "Unauthorized"

    def __init__(self, detail: str | None = None, **kwargs: Any):
        kwargs.setdefault("headers", {"WWW-Authenticate": 'Bearer realm="controlplane"'})
        super().__init__(detail or "valid credentials are required", **kwargs)


class StepUpRequired(Unauthorized):
    """RFC 9470: the caller is authenticated, but not recently or strongly enough."""

    code, title = "step_up_required", "Step-Up Authentication Required"


class Forbidden(Problem):
    """The caller is known but may not do this; the ``code`` says why (``self_review``,
    ``reviewer_role_required``, ...)."""

    status, code, title = 403, "forbidden", "Forbidden"


class PolicyDenied(Forbidden):
    """The policy denied the request; ``reasons`` carries its reason codes."""

    code, title = "denied", "Denied By Policy"


class ApprovalRequired(Forbidden):
    """The action needs an approved ticket; ``bindings`` says what the ticket must bind."""

    code, title = "approval_required", "Approval Required"


class TicketBindingMismatch(Forbidden):
    """The presented ticket is bound to another request; ``fields`` names the bindings
    that differ."""

    code, title = "ticket_binding_mismatch", "Approval Ticket Does Not Match"


class NotFound(Problem):
    """No such route or resource; the ``code`` names the kind (``ticket_not_found``,
    ``task_not_found``, ...)."""

    status, code, title = 404, "not_found", "Not Found"


class MethodNotAllowed(Problem):
    """The path exists but does not answer this method (with ``Allow``)."""

    status, code, title = 405, "method_not_allowed", "Method Not Allowed"


class Conflict(Problem):
    """The resource's state does not allow this (``ticket_consumed``, ``task_state_conflict``,
    ...); ``state`` names the current state where there is one."""

    status, code, title = 409, "conflict", "Conflict"


class Gone(Problem):
    """The resource is no longer served."""

    status, code, title = 410, "gone", "Gone"


class LegacyOnly(Gone):
    """A legacy endpoint (``POST /api/v1/aidb/query``); ``migration`` names the replacement."""

    code, title = "legacy_only", "Legacy Endpoint: Migration Needed"


class PayloadTooLarge(Problem):
    """The body is over ``server.max_body_bytes``."""

    status, code, title = 413, "payload_too_large", "Payload Too Large"


class UnsupportedMediaType(Problem):
    """A body sent with a content type other than ``application/json`` (or ``+json``)."""

    status, code, title = 415, "unsupported_media_type", "Unsupported Media Type"


class SchemaValidationFailed(Problem):
    """The body or query fails its schema; ``errors`` lists each failed constraint with its
    JSON pointer."""

    status, code, title = 422, "schema_validation_failed", "Request Body Failed Validation"


class JSONTooDeep(SchemaValidationFailed):
    """A body value nested deeper than ``limits.MAX_JSON_DEPTH`` (64)."""

    code, title = "too_deep", "JSON Nests Too Deeply"


class JSONTooLarge(SchemaValidationFailed):
    """A body value whose compact JSON is over ``limits.MAX_JSON_VALUE_BYTES`` (256 KiB)."""

    code, title = "too_large", "JSON Value Too Large"


class InvalidString(SchemaValidationFailed):
    """A string the store cannot keep: U+0000 or an unpaired surrogate."""

    code, title = "invalid_string", "String Cannot Be Stored"


class InvalidNumber(SchemaValidationFailed):
    """A number outside I-JSON (RFC 7493)."""

    code, title = "invalid_number", "Number Outside I-JSON"


class ComposeTooLarge(SchemaValidationFailed):
    """A compose document over the preflight's size budget (service.compose.preflight)."""

    code, title = "compose_too_large", "Compose Document Too Large"


class EvaluationBudgetExceeded(SchemaValidationFailed):
    """A compose report not finished within the preflight's time budget."""

    code, title = "evaluation_budget_exceeded", "Compose Evaluation Over Its Time Budget"


class EvaluationFailed(SchemaValidationFailed):
    """A compose report whose evaluator process died (a native crash) or broke its protocol:
    nothing was reported; this document, not the service, is the likely cause."""

    code, title = "evaluation_failed", "Compose Evaluation Failed"


# The bounds of service.limits (raised by the body reader, the resource hash and the store's
# JSON serialiser) -> their problems: one class per code.
_LIMIT_PROBLEMS: dict[type[limits.JSONValueRefused], type[SchemaValidationFailed]] = {
    limits.TooDeep: JSONTooDeep,
    limits.TooLarge: JSONTooLarge,
    limits.InvalidString: InvalidString,
    limits.InvalidNumber: InvalidNumber,
}


class TooManyRequests(Problem):
    """Too many attempts (``login_throttled``: failed logins or OTP codes); ``Retry-After``
    says when to try again."""

    status, code, title = 429, "rate_limited", "Too Many Requests"

    def __init__(self, retry_after_s: int, detail: str | None = None, **kwargs: Any):
        retry = str(max(1, int(retry_after_s)))
        kwargs.setdefault("headers", {"Retry-After": retry})
        super().__init__(detail or f"retry after {retry} seconds", **kwargs)


class TooManyStreams(TooManyRequests):
    """Live event streams are capped per principal and per worker."""

    code = "too_many_streams"


class RequestHeaderFieldsTooLarge(Problem):
    """A request head over the header limits (``service.edge``): too many fields, a field too
    long, or too many bytes in all."""

    status, code, title = 431, "header_fields_too_large", "Request Header Fields Too Large"


class InternalError(Problem):
    """A bug: the body carries only the correlation id; the traceback is in the service's log
    under it."""

    status, code, title = 500, "internal_error", "Internal Server Error"


class ServiceUnavailable(Problem):
    """A dependency is not configured or not reachable (``not_ready``, ``store_unavailable``,
    ``audit_unavailable``, ...): nothing was executed."""

    status, code, title = 503, "service_unavailable", "Service Unavailable"


class ApprovalRepositoryUnavailable(ServiceUnavailable):
    """No approval repository is configured (``approvals.store: none``): ticket requests and
    every action that needs a ticket are refused."""

    code, title = "approval_repository_unavailable", "Approval Repository Unavailable"


class OutcomeUnknown(ServiceUnavailable):
    """The store lost the answer to a write's COMMIT: the action may have executed.

    Unlike ``store_unavailable`` (nothing was executed) this is not a plain "retry later": the
    caller checks what it asked for (the ids in the body) before repeating it. The chain adds
    those ids (``ticket_id``, ``task_id``, ...) and ``check``, where to look.
    """

    code, title = "outcome_unknown", "Outcome Unknown"


# aiohttp's own HTTP exceptions (raised by the router and the body reader) mapped to problems.
_HTTP_EXCEPTIONS: dict[int, type[Problem]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    410: Gone,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: SchemaValidationFailed,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


def to_problem(exc: BaseException) -> Problem:
    """The one table from exceptions to problems; anything unknown is an opaque 500."""
    if isinstance(exc, Problem):
        return exc
    if isinstance(exc, ValidationFailed):
        return SchemaValidationFailed(
            "the request body does not match its schema",
            errors=[v.as_dict() for v in exc.violations],
        )
    if isinstance(exc, limits.JSONValueRefused):
        refused = _LIMIT_PROBLEMS.get(type(exc), SchemaValidationFailed)
        return refused(exc.message, errors=[{"pointer": exc.pointer, "message": exc.message}])
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allow = ", ".join(sorted(exc.allowed_methods))
        return MethodNotAllowed(
            f"{exc.method} is not allowed here; allowed: {allow}", headers={"Allow": allow}
        )
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return PayloadTooLarge("the request body exceeds the configured size limit")
    if isinstance(exc, web.HTTPNotFound):
        return NotFound("no such resource")
    if isinstance(exc, web.HTTPException):
        cls = _HTTP_EXCEPTIONS.get(exc.status, BadRequest if exc.status < 500 else InternalError)
        if cls is TooManyRequests:
            return TooManyRequests(int(exc.headers.get("Retry-After", "1")))
        return cls()
    mapped = _domain_problem(exc)
    if mapped is not None:
        return mapped
    return InternalError("an unexpected error occurred; quote the correlation id when reporting it")


#: Retry-After of a 503 store_unavailable: about one store reconnect interval.
STORE_RETRY_AFTER_S = 2

# Store conflicts whose meaning is "the ticket does not fit this request" rather than a state race.
_FORBIDDEN_CONFLICTS = {"ticket_binding_mismatch"}


def _domain_problem(exc: BaseException) -> Problem | None:
    """The table from HTTP-free domain errors (store, AuthN, approvals, tasks) to problems."""
    # Imported here: these modules are HTTP-free and must not depend on this one.
    from .approvals.tickets import NotEligibleReviewer
    from .authn import errors as authn
    from .store import base as store
    from .tasks.tasks import IllegalTransition, TaskClaimed

    if isinstance(exc, rfc8785.CanonicalizationError):
        # Only a request's resource is hashed from client data: a value RFC 8785 cannot
        # canonicalize (an integer beyond 2**53 - 1, a non-finite number, an unpaired
        # surrogate) cannot be bound to a ticket, so the request is refused, not failed.
        return SchemaValidationFailed(
            "the resource cannot be hashed: it is not I-JSON (RFC 7493)",
            errors=[{"pointer": "/resource", "message": "must be I-JSON: integers within "
                     "+-(2**53 - 1), finite numbers, no unpaired surrogates"}],
        )
    if isinstance(exc, store.StoreOutcomeUnknown):
        # COMMIT was sent and its answer lost: the answer claims neither outcome.
        return OutcomeUnknown("the store did not confirm the outcome: the action may have been "
                              "executed; check its result before repeating it")
    if isinstance(exc, store.StoreUnavailable):
        # Nothing was executed (a COMMIT in flight is OutcomeUnknown above): clients retry.
        return ServiceUnavailable("the store is unavailable; retry later",
                                  code="store_unavailable",
                                  headers={"Retry-After": str(STORE_RETRY_AFTER_S)})
    if isinstance(exc, store.NotFound):
        return NotFound(f"no such {exc.kind}")
    if isinstance(exc, store.Conflict):
        if exc.reason in _FORBIDDEN_CONFLICTS:
            return TicketBindingMismatch("the ticket is bound to another request",
                                         fields=list(exc.fields))
        if exc.current_state:
            return Conflict(str(exc), code=exc.reason, state=exc.current_state)
        return Conflict(str(exc), code=exc.reason)
    if isinstance(exc, authn.Throttled):
        return TooManyRequests(exc.retry_after_s, code="login_throttled")
    if isinstance(exc, authn.StepUpRequired):
        return StepUpRequired(exc.message, headers={"WWW-Authenticate": exc.challenge})
    if isinstance(exc, authn.StepUpUnavailable):
        return Forbidden(exc.message, code=exc.code)
    if isinstance(exc, authn.OtpInvalid):
        return Unauthorized(exc.message, code=exc.code)
    if isinstance(exc, authn.AuthnError):
        # One generic answer: the internal reason (unknown user, wrong password, ...) stays in logs.
        return Unauthorized(exc.message, code=exc.code)
    if isinstance(exc, NotEligibleReviewer):
        return Forbidden(exc.detail, code=exc.code)
    if isinstance(exc, IllegalTransition):
        return Conflict(str(exc), code="task_state_conflict", state=exc.state)
    if isinstance(exc, TaskClaimed):
        return Conflict(str(exc), code="task_claimed")
    return None


def problem_response(problem: Problem, correlation_id: str | None) -> web.Response:
    """Render ``problem`` as an ``application/problem+json`` response."""
    response = web.Response(
        status=problem.status,
        body=json.dumps(problem.body(correlation_id)).encode(),
        content_type=PROBLEM_CONTENT_TYPE,
    )
    response.headers.update(problem.headers)
    return response
