"""The console's pages, rendered on the server (``html.render`` escapes every value).

Pages carry no inline script or style (the CSP forbids both): behaviour lives in
``static/console.js`` and reads ``data-*`` attributes; times are ISO 8601 in ``<time>`` elements
that the script turns into ages and countdowns (the text without the script says the time).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from ..approvals.summary import resource_summary
from ..logs import MASK
from .html import Markup, join, render

__all__ = [
    "CSP",
    "audit_page",
    "error_page",
    "inbox_items",
    "inbox_page",
    "login_page",
    "requests_page",
    "secure",
    "signed_in_page",
    "ticket_page",
]

#: The console's Content-Security-Policy: its own script and style only, nothing inline, no
#: framing, no foreign form targets.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; "
       "object-src 'none'")

#: Bumped whenever console.css or console.js change, so a cached copy is never used with new HTML.
ASSET_VERSION = "6"

_LAYOUT = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title · controlplane console</title>
<link rel="icon" href="/console/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/console/static/console.css?v=$version">
<script src="/console/static/console.js?v=$version" defer></script>
</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<header class="top">
<span class="brand">controlplane</span>
$nav
</header>
<main id="main" tabindex="-1">
<h1>$title</h1>
$body
</main>
</body>
</html>
"""

_NAV = """<nav aria-label="Console">
<ul>
<li><a href="/console/"$inbox_current>Inbox</a></li>
<li><a href="/console/requests"$requests_current>My requests</a></li>
</ul>
<form class="logout" method="post" action="/console/logout">
<input type="hidden" name="csrf" value="$csrf">
<span class="who">$who</span>
<button type="submit">Sign out</button>
</form>
</nav>"""

#: What a refusal means, for people; keyed by the stable problem code (never the exception text).
MESSAGES: Mapping[str, str] = {
    "self_review": "You cannot review a ticket you requested or that is for you.",
    "reviewer_not_human": "Only people can review approval tickets.",
    "duplicate_review": "You have already reviewed this ticket.",
    "reviewer_role_required": "This ticket needs a reviewer with another role.",
    "reviewer_group_required": "This ticket still needs an approval from another group.",
    "step_up_required": "Confirm with a one-time code from your authenticator to review this ticket.",
    "otp_invalid": "That one-time code was not accepted. Enter the current code.",
    "step_up_required_sso": "Confirm at your sign-in provider to review this ticket.",
    "step_up_not_available": "Your account cannot step up (no authenticator enrolled).",
    "login_throttled": "Too many attempts. Wait a moment and try again.",
    "invalid_credentials": "Unknown user or wrong password.",
    "identity_provider_unavailable": "The sign-in provider cannot be reached. Try again shortly.",
    "idp_refused": "The sign-in provider did not sign you in.",
    "subject_not_allowed": "This account may not sign in here.",
    "subject_collision": "This account's name belongs to someone else here. An administrator "
                         "must link the account before it can sign in.",
    "subject_invalid": "The sign-in provider sent a name that cannot be used here.",
    "sso_failed": "The single sign-on did not complete. Start it again.",
    "denied": "The policy does not allow you to do this.",
    "state_conflict": "The ticket is no longer pending.",
    "ticket_not_found": "There is no such ticket.",
    "schema_validation_failed": "The form was not filled in correctly.",
    "store_unavailable": "The service cannot reach its store right now. Try again shortly.",
    # Not "refused": the store lost the answer, so the action may have taken effect.
    "outcome_unknown": "The service could not confirm whether this took effect. Check the "
                       "ticket's state below before trying again.",
}


def message(code: str) -> str:
    return MESSAGES.get(code, "The request was refused.")


def _alert(code: str | None) -> Markup:
    if not code:
        return Markup("")
    return render('<p class="alert" role="alert" data-code="$code">$text</p>',
                  code=code, text=message(code))


def layout(title: str, body: Markup, *, who: str | None = None, csrf: str | None = None,
           current: str = "") -> Markup:
    """A whole page; with ``who`` (signed in) the navigation and sign-out form."""
    nav = Markup("")
    if who is not None:
        cur = ' aria-current="page"'
        nav = render(_NAV, csrf=csrf or "", who=who,
                     inbox_current=Markup(cur if current == "inbox" else ""),
                     requests_current=Markup(cur if current == "requests" else ""))
    return render(_LAYOUT, title=title, nav=nav, body=body, version=ASSET_VERSION)


def secure(response: web.StreamResponse) -> web.StreamResponse:
    """The headers every console response carries (the CSP, no caching, no framing)."""
    response.headers["Content-Security-Policy"] = CSP
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers["X-Frame-Options"] = "DENY"
    # Browsers send ``Origin: null`` on form posts under ``no-referrer``; the console checks
    # Origin on every post, so its pages send their origin to themselves and nowhere else.
    response.headers["Referrer-Policy"] = "same-origin"
    return response


def login_page(*, csrf: str, next_path: str, error: str | None, subject: str = "",
               providers: Sequence[tuple[str, str]] = ()) -> Markup:
    """The sign-in form, and one "Sign in with <provider>" link per ``(label, href)``."""
    sso = Markup("")
    if providers:
        links = join(render('<li><a class="button sso" href="$href">Sign in with $label</a></li>',
                            href=href, label=label) for label, href in providers)
        sso = render('<section class="card sso" aria-labelledby="sso-heading">'
                     '<h2 id="sso-heading">Single sign-on</h2><ul class="sso">$links</ul>'
                     '</section>', links=links)
    body = render("""$alert
<form class="card login" method="post" action="/console/login">
<input type="hidden" name="csrf" value="$csrf">
<input type="hidden" name="next" value="$next">
<p><label for="subject_id">User</label>
<input id="subject_id" name="subject_id" autocomplete="username" required maxlength="200"
 value="$subject" autofocus></p>
<p><label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password"
 required maxlength="1024"></p>
<p><button type="submit">Sign in</button></p>
</form>
$sso""", alert=_alert(error), csrf=csrf, next=next_path, subject=subject, sso=sso)
    return layout("Sign in", body)


def signed_in_page(*, who: str, next_path: str, stepped: bool = False) -> Markup:
    """After a single sign-on (or a step-up at the provider): where the browser goes next (it
    follows the ``Refresh`` header the page is served with; the link is there for the person)."""
    done = "Confirmed at the sign-in provider as" if stepped else "Signed in as"
    body = render('<p>$done <strong>$who</strong>.</p>'
                  '<p><a id="continue" href="$next">Continue to the console</a></p>',
                  done=done, who=who, next=next_path)
    return layout("Confirmed" if stepped else "Signed in", body)


def error_page(status: int, code: str, *, who: str | None = None, csrf: str | None = None
               ) -> Markup:
    body = render('$alert<p><a href="/console/">Back to the inbox</a></p>', alert=_alert(code))
    return layout(f"Error {status}", body, who=who, csrf=csrf)


# -- tickets ------------------------------------------------------------------------------------


def command_text(command: Any) -> str | None:
    """A ticket's command as one line: a string as is, an argv array shell-quoted (a masked
    value shown as ``***``, as in a command line, not quoted as if it were the value)."""
    if command is None:
        return None
    if isinstance(command, list):
        return " ".join(MASK if part == MASK else shlex.quote(str(part)) for part in command)
    return str(command)


def _command(command: Any) -> Markup:
    text = command_text(command)
    if text is None:
        return Markup('<span class="muted">no command bound</span>')
    kind = "argv" if isinstance(command, list) else "command line"
    return render('<pre class="command" data-kind="$kind"><code>$text</code></pre>',
                  kind=kind, text=text)


def _time(iso: str | None, *, cls: str = "", label: str = "") -> Markup:
    if not iso:
        return Markup('<span class="muted">&#8211;</span>')
    return render('<time class="$cls" datetime="$iso" data-label="$label">$iso</time>',
                  cls=cls, iso=iso, label=label)


def _deadline(view: Mapping[str, Any]) -> Markup:
    """The clock that matters now: pending_until while pending, expires_at once approved."""
    if view["state"] == "pending":
        return _time(view.get("pending_until"), cls="countdown", label="review by")
    if view["state"] == "approved":
        return _time(view.get("expires_at"), cls="countdown", label="use by")
    closed = view.get("consumed_at") if view["state"] == "consumed" else view.get("closed_at")
    return _time(closed, cls="age", label=view["state"])


def inbox_items(pending: Sequence[Mapping[str, Any]], recent: Sequence[Mapping[str, Any]]
                ) -> Markup:
    """The inbox list (also the live stream's payload): tickets to review, then recent ones."""
    def row(view: Mapping[str, Any]) -> Markup:
        return render("""<li class="ticket state-$state" data-ticket="$id">
<a class="title" href="/console/tickets/$id"><span class="action">$action</span>
 <span class="resource-summary">$summary</span>
 in <span class="env">$env</span> for <span class="subject">$subject</span></a>
<p class="meta">requested by <span class="requester">$requester</span> · $age · $deadline
 · <span class="state">$state</span></p>
$command
<p class="reason">$reason</p>
</li>""", id=view["id"], action=view["action"], summary=_summary(view),
            env=view["env"], subject=view["subject_id"],
            requester=view["requested_by"], state=view["state"],
            age=_time(view["created_at"], cls="age", label="requested"),
            deadline=_deadline(view), command=_command(view.get("command")),
            reason=view.get("reason") or "")

    first = (join(row(v) for v in pending) if pending else
             Markup('<li class="empty">Nothing waits for your review.</li>'))
    parts = [render('<h2 id="to-review">To review <span class="count">$n</span></h2>'
                    '<ol class="tickets" aria-labelledby="to-review">$rows</ol>',
                    n=len(pending), rows=first)]
    if recent:
        parts.append(render('<h2 id="recent">Recently decided</h2>'
                            '<ol class="tickets" aria-labelledby="recent">$rows</ol>',
                            rows=join(row(v) for v in recent)))
    return join(parts)


def inbox_page(items: Markup, *, who: str, csrf: str) -> Markup:
    # The list itself is not a live region (its clocks change every second); a status line
    # announces each update instead.
    body = render('<p id="inbox-status" class="visually-hidden" role="status"></p>'
                  '<div id="inbox" data-stream="/console/inbox/events">$items</div>', items=items)
    return layout("Inbox", body, who=who, csrf=csrf, current="inbox")


def requests_page(views: Sequence[Mapping[str, Any]], *, who: str, csrf: str) -> Markup:
    rows = join(render("""<tr>
<td><a href="/console/tickets/$id">$id</a></td><td>$action</td><td>$env</td>
<td><span class="state state-$state">$state</span></td><td>$created</td><td>$deadline</td>
</tr>""", id=v["id"], action=v["action"], env=v["env"], state=v["state"],
        created=_time(v["created_at"], cls="age", label="requested"), deadline=_deadline(v))
        for v in views)
    if not views:
        rows = Markup('<tr><td colspan="6">You have no approval requests.</td></tr>')
    body = render("""<div class="scroll"><table>
<caption>Tickets for you or requested by you, newest first</caption>
<thead><tr><th scope="col">Ticket</th><th scope="col">Action</th><th scope="col">Env</th>
<th scope="col">State</th><th scope="col">Requested</th><th scope="col">Deadline</th></tr></thead>
<tbody>$rows</tbody></table></div>""", rows=rows)
    return layout("My requests", body, who=who, csrf=csrf, current="requests")


def _summary(view: Mapping[str, Any]) -> str:
    """The ticket's resource in one short line (``app=payments version=2.4.0``)."""
    summary = view.get("resource_summary")
    return summary if isinstance(summary, str) else resource_summary(view.get("resource"))


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _list(values: Sequence[Any]) -> Markup:
    if not values:
        return Markup('<span class="muted">none</span>')
    return join(render("<li>$v</li>", v=v) for v in values)


def policy_change(change: Mapping[str, Any] | None) -> Markup:
    """A policy ticket's change (``policytools.change.report``): who and why, vetting, the diff
    against the running revision with its text, and the replayed impact with examples."""
    if change is None:
        return Markup("")
    diff, impact = change.get("diff") or {}, change.get("impact") or {}
    vetting = change.get("vetting") or {}
    result = vetting.get("passed")
    passed = "passed" if result is True else "failed" if result is False else "not vetted yet"
    files = join(render("""<li><code>$file</code> <span class="status">$status</span>
<span class="added">+$added</span> <span class="removed">-$removed</span></li>""", **f)
                 for f in diff.get("files") or [])
    examples = join(render("""<li><strong>$transition</strong> $subject · $action on $env
· $ts</li>""", transition=t, subject=e.get("subject"), action=e.get("action"),
                           env=e.get("env"), ts=e.get("ts") or "")
                    for t, g in (impact.get("groups") or {}).items()
                    for e in g.get("examples") or [])
    return render("""<section aria-labelledby="change" id="policy-change">
<h2 id="change">The policy change</h2>
<dl class="facts">
<dt>Revision</dt><dd><code>$revision</code> ($source)</dd>
<dt>Author</dt><dd>$author</dd>
<dt>Message</dt><dd class="message">$message</dd>
<dt>Vetting</dt><dd class="vetting">$passed <small>($by)</small></dd>
<dt>Against</dt><dd><code>$against</code></dd>
<dt>Impact</dt><dd class="impact">$summary<ul class="plain">$examples</ul></dd>
<dt>Diff</dt><dd class="diff-summary">$count files, +$added -$removed lines
<ul class="plain">$files</ul></dd>
</dl>
<pre class="diff"><code>$text</code></pre>
</section>""", revision=change.get("revision") or "the policies directory",
        source=change.get("source") or "", author=change.get("author") or "-",
        message=change.get("message") or "-", passed=passed, by=vetting.get("by") or "",
        against=change.get("against") or "", summary=change.get("impact_summary") or "",
        examples=examples, count=len(diff.get("files") or []), added=diff.get("added", 0),
        removed=diff.get("removed", 0), files=files, text=diff.get("text") or "")


def ticket_page(view: Mapping[str, Any], *, timeline: Sequence[Mapping[str, Any]],
                policy_reasons: Sequence[str], review_form: Markup, who: str, csrf: str,
                error: str | None = None, reviewers: Sequence[str] | None = None,
                change: Mapping[str, Any] | None = None) -> Markup:
    stored = view.get("approval")
    approval: Mapping[str, Any] = stored if isinstance(stored, dict) else {}
    approvals = [r for r in view["reviews"] if r["decision"] == "approve"]
    reviews = join(render("""<li class="review review-$decision">
<span class="reviewer">$reviewer</span> <strong>$decision</strong>$group · $at
<p class="reason">$reason</p></li>""", decision=r["decision"], reviewer=r["reviewer"],
        group=Markup(render(" for <span>$g</span>", g=r["group"]) if r.get("group") else ""),
        at=_time(r["at"]), reason=r.get("reason") or "") for r in view["reviews"])
    events = join(render("""<li><span class="seq">#$seq</span> $at · <span class="who">$who</span>
· <span class="what">$what</span> · <span class="outcome">$outcome</span></li>""", **e)
        for e in timeline)
    body = render("""<div id="ticket" data-stream="/console/tickets/$id/events" data-state="$state"
 data-reviews="$review_count">
$alert
<p id="changed" class="alert" role="status" hidden>This ticket has changed.
<a href="/console/tickets/$id">Show the current state</a></p>
<p class="summary"><span class="state state-$state" id="state">$state</span> $deadline</p>
<section aria-labelledby="what"><h2 id="what">What is asked</h2>
<dl class="facts">
<dt>Ticket</dt><dd><code>$id</code></dd>
<dt>Action</dt><dd>$action</dd>
<dt>Environment</dt><dd>$env</dd>
<dt>Subject</dt><dd>$subject</dd>
<dt>Requested by</dt><dd>$requester</dd>
<dt>Requested</dt><dd>$created</dd>
<dt>Reason</dt><dd class="reason">$reason</dd>
<dt>Command</dt><dd>$command</dd>
<dt>Resource</dt><dd><p class="resource-summary">$summary</p>
<pre class="resource"><code>$resource</code></pre>
<small>hash <code>$resource_hash</code></small></dd>
</dl></section>
$change
<section aria-labelledby="pol"><h2 id="pol">Policy</h2>
<dl class="facts">
<dt>Quorum</dt><dd><span id="quorum">$approved of $quorum</span> approvals</dd>
<dt>Required groups</dt><dd><ul class="plain">$groups</ul></dd>
<dt>Reviewer roles</dt><dd><ul class="plain">$roles</ul></dd>
<dt>Policy reasons</dt><dd><ul class="plain">$reasons</ul></dd>
$suggested</dl></section>
<section aria-labelledby="rev"><h2 id="rev">Reviews</h2>
<ul class="reviews">$reviews</ul>
$review_form
</section>
<section aria-labelledby="tl"><h2 id="tl">Timeline</h2>
<ol class="timeline" id="timeline">$events</ol>
<p><a href="/console/tickets/$id/audit">All audit records of this ticket</a></p>
</section>
</div>""", alert=_alert(error), review_count=len(view["reviews"]), state=view["state"],
        deadline=_deadline(view), id=view["id"],
        action=view["action"], env=view["env"], subject=view["subject_id"],
        requester=view["requested_by"], created=_time(view["created_at"], cls="age"),
        reason=view.get("reason") or "", command=_command(view.get("command")),
        resource=_pretty(view["resource"]), resource_hash=view["resource_hash"],
        summary=_summary(view),
        approved=len(approvals), quorum=view.get("quorum", 1),
        groups=_list(approval.get("require_groups", [])),
        roles=_list(approval.get("reviewer_roles", [])), reasons=_list(policy_reasons),
        reviews=reviews or Markup('<li class="muted">No reviews yet.</li>'),
        review_form=review_form, events=events, suggested=_suggested(reviewers),
        change=policy_change(change))
    return layout(f"Ticket {view['id']}: {view['action']} {_summary(view)}", body, who=who,
                  csrf=csrf)


def _suggested(reviewers: Sequence[str] | None) -> Markup:
    """Who could approve now (the review endpoint's own rule); nothing for a closed ticket."""
    if reviewers is None:
        return Markup("")
    return render("""<dt>Who can approve</dt><dd><ul class="plain" id="reviewers">$items</ul></dd>
""", items=_list(reviewers))


def review_form(ticket_id: str, *, csrf: str, needs_step_up: bool, reason: str = "",
                sso: bool = False) -> Markup:
    """Approve / reject with a reason; when a step-up is needed, the one-time-code field, or
    for a person signed in through single sign-on the button that confirms at the provider."""
    otp = Markup("")
    if needs_step_up and sso:
        return Markup(sso_step_up_form(ticket_id) + review_form(
            ticket_id, csrf=csrf, needs_step_up=False, reason=reason))
    if needs_step_up:
        otp = Markup("""<p class="stepup"><label for="otp">One-time code (step-up)</label>
<input id="otp" name="otp" inputmode="numeric" pattern="[0-9]{6}" maxlength="6"
 autocomplete="one-time-code" required
 aria-describedby="otp-help">
<small id="otp-help">Reviewing a production ticket needs a recent confirmation from your
authenticator.</small></p>""")
    return render("""<form class="card review" method="post" action="/console/tickets/$id/review">
<input type="hidden" name="csrf" value="$csrf">
<p><label for="reason">Reason</label>
<textarea id="reason" name="reason" rows="3" maxlength="1000">$reason</textarea></p>
$otp
<p class="buttons"><button type="submit" name="decision" value="approve" class="approve">Approve</button>
<button type="submit" name="decision" value="reject" class="reject">Reject</button></p>
</form>""", id=ticket_id, csrf=csrf, otp=otp, reason=reason)


def sso_step_up_form(ticket_id: str) -> Markup:
    """Step up by signing in again at the provider (in this browser), back to the ticket."""
    return render("""<p class="card stepup"><span id="sso-step-up-help">Reviewing a production
ticket needs a recent confirmation: sign in again at your sign-in provider; you come back to
this ticket.</span>
<a class="button" id="sso-step-up" href="/console/tickets/$id/step-up"
 aria-describedby="sso-step-up-help">Confirm at the sign-in provider</a></p>""", id=ticket_id)


def cannot_review(code: str, detail: str | None = None) -> Markup:
    """Why this person cannot review: the refusal's own detail (it names the missing role or
    group, as the API's does), else the code's message."""
    text = f"{detail[:1].upper()}{detail[1:]}." if detail else message(code)
    return render('<p class="muted" data-code="$code">$text</p>', code=code, text=text)


def audit_page(ticket_id: str, records: Sequence[Mapping[str, Any]], *, truncated: bool,
               who: str, csrf: str) -> Markup:
    items = join(render("""<li><h2 class="record">#$seq <small>$at</small></h2>
<pre><code>$entry</code></pre></li>""", seq=r["seq"], at=r.get("at", ""), entry=_pretty(r))
        for r in records)
    note = Markup('<p class="alert" role="status">Only the newest records were searched; older '
                  'ones are in <code>cpctl audit tail</code>.</p>') if truncated else Markup("")
    body = render("""<p><a href="/console/tickets/$id">Back to the ticket</a></p>$note
<ol class="audit">$items</ol>""", id=ticket_id, note=note,
        items=items or Markup('<li class="muted">No records.</li>'))
    return layout(f"Audit records of {ticket_id}", body, who=who, csrf=csrf)
