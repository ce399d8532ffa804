#!/usr/bin/env bash
# The curl walkthrough (docs/walkthrough.md) as one script: run it from the repository root
# against a running development server (`make run`, or `cpctl serve --port $PORT`).
#
#   PORT=8700 examples/walkthrough.sh
#
# It can run again at once: each run uses its own task, and a TOTP code is never sent twice
# (the server accepts a code once; the script waits for the next 30 s step instead). Any refusal
# it did not expect stops it with the server's problem code, never a traceback.
set -euo pipefail

PORT=${PORT:-8700}
BASE=${BASE:-http://127.0.0.1:$PORT}
API=$BASE/api/v1
PY=${PYTHON:-.venv/bin/python}
RUN=release-$(date +%s)-$$            # this run's task: re-runs never collide
VERSION=1.2.3-$RUN

say() { printf '\n== %s\n' "$*"; }

# One member of a JSON answer; a refusal (application/problem+json) is named, not a KeyError.
field() {
  "$PY" -c '
import json, sys
try:
    doc = json.load(sys.stdin)
except ValueError:
    sys.exit("walkthrough: the answer is not JSON")
if isinstance(doc, dict) and sys.argv[1] in doc:
    print(doc[sys.argv[1]])
else:
    problem = doc if isinstance(doc, dict) else {}
    status, code, detail = (problem.get(k) for k in ("status", "code", "detail"))
    sys.exit(f"walkthrough: no {sys.argv[1]} in the answer: {status} {code}: {detail}")' "$1"
}

# The current TOTP code of a dev identity (examples/identities.yaml).
totp() { "$PY" examples/totp.py "$1"; }

# Step a session up. A code is accepted once: when this step's code was used already (a run a
# moment ago), wait for the next 30 s step and use its code.
step_up() {  # SUBJECT TOKEN -> the stepped-up token
  local answer
  for _ in 1 2; do
    answer=$(curl -s "$API/authn/step-up" -H "Authorization: Bearer $2" \
      -H 'Content-Type: application/json' -d "{\"otp\":\"$(totp "$1")\"}")
    if printf '%s' "$answer" | field access_token 2>/dev/null; then return 0; fi
    echo "walkthrough: $1's code for this 30 s step was used already; waiting for the next" >&2
    sleep $(( 31 - $(date +%s) % 30 ))
  done
  printf '%s' "$answer" | field access_token
}

login() {  # SUBJECT PASSWORD -> token
  curl -s "$API/authn/sessions" -H 'Content-Type: application/json' \
    -d "{\"subject_id\":\"$1\",\"password\":\"$2\"}" | field access_token
}

say "Public status surfaces: never a token, session, DSN, raw policy or per-subject decision"
curl -s "$API/system/info"; echo; curl -s "$API/authn/status"; echo; curl -s "$API/authz/status"; echo
curl -s "$BASE/healthz"; echo; curl -s "$BASE/readyz"; echo
# /metrics is long (every route's counters and histograms): a few request counters only.
{ curl -s "$BASE/metrics" | grep -m 5 '^controlplane_http_requests_total'; } || true

say "AuthN: alice logs in (a 15-minute EdDSA access token) and steps up with a TOTP code"
ALICE=$(login alice alice-dev-password)
ALICE=$(step_up alice "$ALICE")
curl -s "$API/authn/sessions/current" -H "Authorization: Bearer $ALICE"; echo

say "A production run without a ticket: 403 approval_required, naming the bindings to request"
RESOURCE="{\"app\":\"web\",\"version\":\"$VERSION\"}"
BODY="{\"task_id\":\"$RUN\",\"action\":\"installer.run.execute\",\"env\":\"prod\",\"resource\":$RESOURCE}"
curl -s "$API/installer/actions" -H "Authorization: Bearer $ALICE" -H 'Content-Type: application/json' -d "$BODY"; echo

say "Request the ticket (201; the nonce is shown to the requester once, here)"
TICKET=$(curl -s "$API/approvals" -H "Authorization: Bearer $ALICE" -H 'Content-Type: application/json' \
  -d "{\"subject_id\":\"alice\",\"env\":\"prod\",\"action\":\"installer.run.execute\",\"resource\":$RESOURCE,\"reason\":\"release $VERSION\"}")
ID=$(printf '%s' "$TICKET" | field id); NONCE=$(printf '%s' "$TICKET" | field nonce)
echo "ticket $ID"

say "Follow it live (server-sent events: the ticket, each change, end once settled)"
curl -sN -m 20 "$API/approvals/$ID/events" -H "Authorization: Bearer $ALICE" \
  -H 'Accept: text/event-stream' & STREAM=$!

say "bob (an SRE approver) steps up and approves; requesters, subjects and agents cannot review"
BOB=$(login bob bob-dev-password)
BOB=$(step_up bob "$BOB")
curl -s "$API/approvals/$ID/reviews" -H "Authorization: Bearer $BOB" -H 'Content-Type: application/json' \
  -d '{"decision":"approve","reason":"change CHG-42 approved"}'; echo
wait "$STREAM" || true

say "alice runs with the ticket: 202 with the step event; the same ticket again: 409 ticket_consumed"
curl -s "$API/installer/actions" -H "Authorization: Bearer $ALICE" -H 'Content-Type: application/json' \
  -H "Approval-Ticket: $ID" -H "Approval-Nonce: $NONCE" -d "$BODY"; echo
curl -s "$API/installer/actions" -H "Authorization: Bearer $ALICE" -H 'Content-Type: application/json' \
  -H "Approval-Ticket: $ID" -H "Approval-Nonce: $NONCE" -d "$BODY"; echo

say "The executor (ci-bot, a service: it logs in with its key) claims the task and reports"
# examples/executor/executor.py does this for every pending task; here it is by hand.
ASSERTION=$("$PY" -c '
from pathlib import Path
from service.cli.session import DEFAULT_AUDIENCE, key_assertion
print(key_assertion(Path("examples/keys/ci-bot.pem"), "ci-bot", DEFAULT_AUDIENCE))')
CI=$(curl -s "$API/authn/sessions" -H 'Content-Type: application/json' \
  -d "{\"assertion\":\"$ASSERTION\"}" | field access_token)
curl -s "$API/tasks?state=pending" -H "Authorization: Bearer $CI" | field items >/dev/null
curl -s "$API/tasks/$RUN/events" -H "Authorization: Bearer $CI" -H 'Content-Type: application/json' \
  -d '{"kind":"started","step":"helm-upgrade","message":"claimed"}'; echo
curl -s "$API/tasks/$RUN/events" -H "Authorization: Bearer $CI" -H 'Content-Type: application/json' \
  -d '{"kind":"succeeded","step":"helm-upgrade","result":{"revision":7}}'; echo

say "The task and its step events (JSON pages, or live with -H 'Accept: text/event-stream')"
curl -s "$API/tasks/$RUN" -H "Authorization: Bearer $ALICE"; echo
curl -s "$API/tasks/$RUN/events" -H "Authorization: Bearer $ALICE"; echo

say "Compose preflight (a report with passed true/false; deploys nothing)"
curl -s "$API/compose/import" -H "Authorization: Bearer $ALICE" -H 'Content-Type: application/json' \
  -d '{"env":"prod","fields":{"services":{"web":{"image":"nginx:latest","privileged":true}}}}'; echo

say "Read-only inventory, and the legacy shell (410 legacy_only with a migration pointer)"
curl -s "$API/databases" -H "Authorization: Bearer $ALICE"; echo
curl -s -X POST "$API/aidb/query" -H 'Content-Type: application/json' -d '{}'; echo

say "Log out: every token of the session stops working on every worker at once"
curl -s -o /dev/null -w '%{http_code}\n' -X DELETE "$API/authn/sessions/current" -H "Authorization: Bearer $ALICE"
curl -s -o /dev/null -w '%{http_code}\n' "$API/authn/sessions/current" -H "Authorization: Bearer $ALICE"
