"""What the sinks send for an outbox event: a CloudEvents 1.0 envelope, or a Slack message.

CloudEvents (https://github.com/cloudevents/spec, v1.0.2, JSON format, structured mode): the
body is one JSON object with ``specversion``, ``id`` (the outbox event's UUID: stable across
retries), ``source``, ``type`` (``approval.requested`` ...), ``subject`` (the ticket id),
``time``, ``datacontenttype`` and ``data`` (the ticket as the API shows it, command masked, plus
``actor``, ``review``, ``console_url`` and, for requests, ``suggested_reviewers``), sent as
``application/cloudevents+json``.

The Slack message uses Block Kit (``text`` as the notification fallback, ``blocks``): who asks,
what action, env, a resource summary, the reason, the command, the expiry, suggested reviewers
and a button to the console page. It works with Slack incoming webhooks and the compatible
endpoints of Mattermost and Rocket.Chat.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..approvals.command import is_command, masked
from ..approvals.summary import resource_summary
from ..clock import iso
from ..store.base import OutboxEvent

__all__ = ["cloudevent", "console_url", "event_data", "slack_message"]

#: Characters of the resource and the command shown in a chat message.
SUMMARY_CHARS = 300

_TITLES = {
    "approval.requested": "Approval requested",
    "approval.reviewed": "Ticket reviewed (quorum not reached yet)",
    "approval.approved": "Ticket approved",
    "approval.rejected": "Ticket rejected",
    "approval.expired": "Ticket expired",
    "approval.revoked": "Ticket revoked",
    "approval.consumed": "Ticket used",
}


def console_url(public_url: str | None, ticket_id: str) -> str | None:
    return f"{public_url}/console/tickets/{ticket_id}" if public_url else None


def event_data(event: OutboxEvent, public_url: str | None,
               suggested_reviewers: Sequence[str] | None) -> dict[str, Any]:
    """The event's ``data``: the stored payload plus the console link and, for a request, who
    may review it."""
    data = dict(event.data)
    if is_command(data.get("command")):
        # Masked when the event was written; again here for events queued by an older build.
        data["command"] = masked(data["command"])
    data["console_url"] = console_url(public_url, event.ticket_id)
    if "resource" in data:
        data["resource_summary"] = resource_summary(data["resource"])
    if suggested_reviewers is not None:
        data["suggested_reviewers"] = list(suggested_reviewers)
    return data


def cloudevent(event: OutboxEvent, source: str, data: dict[str, Any]) -> bytes:
    """The structured-mode CloudEvents JSON body."""
    envelope = {
        "specversion": "1.0",
        "id": event.id,
        "source": source,
        "type": event.type,
        "subject": event.ticket_id,
        "time": iso(event.at),
        "datacontenttype": "application/json",
        "data": data,
    }
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _escape(text: str) -> str:
    # Slack mrkdwn: &, < and > are control characters (links, mentions); escape them so that
    # a reason or resource cannot ping @channel or forge a link.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int = SUMMARY_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _code(text: str) -> str:
    return "`" + _escape(text.replace("`", "'")) + "`"


def slack_message(event: OutboxEvent, data: dict[str, Any]) -> bytes:
    """The Block Kit message for ``event``."""
    title = _TITLES.get(event.type, event.type)
    action, env = str(data.get("action", "")), str(data.get("env", event.env))
    requester, subject = str(data.get("requested_by", "")), str(data.get("subject_id", ""))
    who = requester if requester == subject else f"{requester} for {subject}"
    summary = resource_summary(data.get("resource"))
    fields = [
        f"*Requester:*\n{_escape(who)}",
        f"*Action:*\n{_code(action)}",
        f"*Environment:*\n{_code(env)}",
        f"*Ticket:*\n{_code(event.ticket_id)}",
        f"*Resource:*\n{_code(summary)}",
    ]
    expiry = data.get("expires_at") if event.type == "approval.approved" else (
        data.get("pending_until") if event.type in ("approval.requested", "approval.reviewed")
        else None)
    if expiry:
        fields.append(f"*Expires:*\n{_escape(str(expiry))}")
    if event.type != "approval.requested":
        fields.append(f"*By:*\n{_escape(str(data.get('actor', '')))}")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text",
                                    "text": _clip(_escape(f"{title}: {action} {summary} in {env}"), 150)}},
        {"type": "section", "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
    ]
    reason = data.get("reason")
    if reason:
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                   "text": "*Reason:* " + _escape(_clip(str(reason)))}})
    review = data.get("review")
    if isinstance(review, dict) and review.get("reason"):
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "*Review:* " + _escape(
            _clip(str(review["reason"])))}})
    command = data.get("command")
    if command is not None:
        shown = command if isinstance(command, str) else json.dumps(command, ensure_ascii=False)
        blocks.append({"type": "section", "text": {"type": "mrkdwn",
                                                   "text": "*Command:* " + _code(_clip(shown))}})
    change = data.get("policy_change")
    if isinstance(change, dict):
        diff = change.get("diff") or {}
        text = (f"*Policy change:* {_code(str(change.get('revision') or 'directory mode'))} by "
                f"{_escape(str(change.get('author') or '-'))}: "
                f"{_escape(_clip(str(change.get('message') or '-')))}\n"
                f"{len(diff.get('files') or [])} files, +{diff.get('added', 0)} "
                f"-{diff.get('removed', 0)} lines against "
                f"{_code(str(change.get('against')))}\n"
                f"*Impact:* {_escape(_clip(str(change.get('impact_summary') or '')))}")
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    reviewers = data.get("suggested_reviewers")
    if reviewers is not None:
        names = ", ".join(_escape(str(r)) for r in reviewers) or "nobody (check the policy data)"
        blocks.append({"type": "context", "elements": [
            {"type": "mrkdwn", "text": f"Suggested reviewers: {names}"}]})
    link = data.get("console_url")
    if link:
        blocks.append({"type": "actions", "elements": [{
            "type": "button", "text": {"type": "plain_text", "text": "Open in the console"},
            "url": link}]})
    text = f"{title}: {action} {summary} in {env} ({who}, {event.ticket_id})"
    body = {"text": _escape(text), "blocks": blocks}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
