"""The action catalogue: every protected action's name and whether it mutates (code-owned)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["ACTIONS", "Action", "all_actions", "get", "resource_table"]


@dataclass(frozen=True)
class Action:
    """One protected action.

    ``mutating`` says the action changes state. ``ticketed`` says a production ``allow`` is
    upgraded to ``require_approval`` by the engine whatever the policy returns; it defaults to
    ``mutating``. The approval workflow's own actions are mutating but not ticketed: a ticket to
    create or review a ticket would never end. ``tasks.report`` only records progress of an
    execution that was already authorised (and ticketed) and is not ticketed either.
    """

    name: str
    mutating: bool
    description: str
    #: ``input.resource.kind`` of this action's requests: code-owned here, so the input of a
    #: request and the input evaluated when a ticket for it is created can never differ.
    resource_kind: str
    ticketed: bool | None = None
    #: What ``input.resource.value`` holds for this action (policies/README.md's table is
    #: generated from it: ``resource_table``).
    resource_value: str = ""

    @property
    def needs_ticket_in_production(self) -> bool:
        return self.mutating if self.ticketed is None else self.ticketed


_AS_SENT = "the request body's `resource` as sent (a string, or an object of up to 64 members)"
_TICKET = ("the resource the ticket is bound to, as it was requested (the ticketed action's "
           "`resource`)")

_CATALOGUE: tuple[Action, ...] = (
    Action("installer.run.execute", True, "run an installer step against an environment",
           "installer_run", resource_value=_AS_SENT + ", e.g. `{\"app\": \"web\", "
           "\"version\": \"1.2.3\"}`; `id` is the task id"),
    Action("approvals.create", True, "request an approval ticket", "approval_ticket",
           ticketed=False, resource_value=_AS_SENT + ": the resource the ticketed action will act "
           "on; `owner` is the ticket's subject, `attributes.target_action` its action"),
    Action("approvals.review", True, "approve or reject a pending ticket", "approval_ticket",
           ticketed=False, resource_value=_TICKET),
    Action("approvals.revoke", True, "revoke a pending or approved ticket", "approval_ticket",
           ticketed=False, resource_value=_TICKET),
    Action("approvals.read", False, "read one approval ticket", "approval_ticket",
           resource_value=_TICKET),
    Action("approvals.list", False, "list approval tickets", "approval_list",
           resource_value='`{"collection": "approvals"}`'),
    Action("compose.import", False, "validate a compose file and report (no side effects)",
           "compose_file", resource_value='a summary of the fields (`hash` covers all of them): '
           '`{"name": <project or null>, "services": {<name>: {"image": <image or null>}}}`'),
    Action("databases.list", False, "list database inventory", "databases",
           resource_value='`{"collection": "databases"}`'),
    Action("storage.list", False, "list storage objects inventory", "storage",
           resource_value='`{"collection": "storage"}`'),
    Action("tasks.read", False, "read a task, its state and step events", "task",
           resource_value='`{"task_id": <id>}`; `owner` is who created the task'),
    Action("tasks.report", True, "append progress/step events to a running task", "task",
           ticketed=False, resource_value='`{"task_id": <id>}`; `owner` is who created the task'),
    Action("audit.read", False, "read and verify the audit log", "audit_log",
           resource_value='`{"collection": "audit"}`'),
    Action("policy.read", False, "list published policy revisions and the active one",
           "policy_revisions", resource_value='`{"collection": "policy_revisions"}`'),
    Action("policy.publish", True, "store a signed policy revision (it does not activate it)",
           "policy_revision", resource_value='`{"revision": <sha256:...>, "digest": <bundle '
           'digest>}`; `attributes.kid` is the signing key'),
    Action("policy.activate", True, "make a published revision the fleet's active one (also "
           "rollback)", "policy_revision", resource_value='`{"revision": <sha256:...>}` (the '
           'same for a rollback to it; `attributes.rollback_from` then names the active one)'),
)

#: name -> Action, for every action the service knows.
ACTIONS: dict[str, Action] = {a.name: a for a in _CATALOGUE}


def get(name: str) -> Action:
    """The catalogue entry for ``name``; ``KeyError`` for an unknown action."""
    return ACTIONS[name]


def all_actions() -> Iterator[Action]:
    """Every action in catalogue order."""
    return iter(_CATALOGUE)


def resource_table() -> str:
    """The Markdown table of ``input.resource`` per action (policies/README.md holds it; a test
    keeps the two equal)."""
    rows = ["| action | `resource.kind` | `resource.value` |", "|---|---|---|"]
    rows += [f"| `{a.name}` | `{a.resource_kind}` | {a.resource_value} |" for a in _CATALOGUE]
    return "\n".join(rows) + "\n"
