# Platform RBAC for the control plane.
#
# Entry point: data.controlplane.authz.decision (`explain` adds a summary to
# `cpctl policy eval --explain`, which derives the contributing rules itself).
#
# Every rule is a function of the input document `inp` and `decision := decide(input)` is the
# only place that reads `input`, so tests call `decide({...})` directly (`with input as V` works
# too under `cpctl policy test`: policies/README.md says which `with` forms do).
#
# The engine projects facts into the input before evaluation (see policies/README.md):
#   input.principal.roles   role names bound to the subject (policies/data bindings)
#   input.principal.groups  reviewer/team groups the subject belongs to
#   input.principal.grants  [{role, envs, kinds?, scope?}]: the grants of those roles (inheritance
#                           resolved) whose `actions` cover input.action
# and the action catalogue (code-owned) into data.controlplane.catalogue.actions.
# The Rego data document holds only small tables: environments, approval requirements and apps.
# input.resource.value is the request's resource as sent (policies/README.md lists it per
# action): the resource rules below read an installer run's app and version.
package controlplane.authz

import rego.v1

decision := decide(input)

explain := explanation(input)

# ---- decision ----------------------------------------------------------------------------

# regopy's cost is per evaluated expression and per user-function call (~2 us each), not per
# rule defined: so checks that only apply to one action sit behind one test of the action, and
# cheap built-ins and inline comprehensions are preferred over small helper functions on the
# path every decision takes. bench/decision_bench.py measures it.

# The grants are matched once and passed down: regopy does not memoise function calls.
decide(inp) := verdict(inp, matching_grants(inp))

verdict(inp, grants) := {"decision": "deny", "reasons": reasons, "approval": {}} if {
	reasons := denials(inp, grants)
	count(reasons) > 0
} else := {"decision": "require_approval", "reasons": approval_reasons(inp), "approval": requirements(inp)} if {
	needs_approval(inp)
} else := {"decision": "allow", "reasons": allow_reasons(grants), "approval": {}}

# Every deny check is evaluated, so a denied caller sees all the reasons at once.
denials(inp, grants) := array.concat(
	array.concat(
		["unknown_env" | not data.environments[inp.env]],
		["unknown_action" | not data.controlplane.catalogue.actions[inp.action]],
	),
	array.concat(action_denials(inp, grants), ["no_grant" | count(grants) == 0]),
)

# ---- deny checks of the ticket workflow ---------------------------------------------------

action_denials(inp, grants) := review_denials(inp) if {
	inp.action == "approvals.review"
} else := ["create_for_other" | create_for_other(inp, grants)] if {
	inp.action == "approvals.create"
} else := []

# Only humans review tickets: agents and services never approve (DESIGN hard rule 5).
# Nobody approves their own ticket; the ticket's owner is the subject it was requested for.
review_denials(inp) := array.concat(
	["reviewer_not_human" | inp.principal.kind != "human"],
	["self_review" | inp.resource.owner == inp.principal.subject_id],
)

# Requesting a ticket for someone else needs a grant with scope "any" (admins);
# other grants let a subject request tickets for itself only.
create_for_other(inp, grants) if {
	object.get(inp.resource, "owner", inp.principal.subject_id) != inp.principal.subject_id
	not any_scope(grants)
}

any_scope(grants) if {
	some g in grants
	g.scope == "any"
}

# ---- grants ------------------------------------------------------------------------------

# input.principal.grants already cover input.action (the engine matched `actions`);
# the policy decides which of them apply in this env and to this kind of principal.
matching_grants(inp) := [g |
	some g in object.get(inp.principal, "grants", [])
	env_matches(g.envs, inp.env)
	kind_matches(g, inp.principal.kind)
]

env_matches(envs, env) if env in envs

env_matches(envs, _) if "*" in envs

kind_matches(g, _) if not g.kinds

kind_matches(g, kind) if kind in g.kinds

# (sorted via an array: in regopy 1.5 sort(set) does not compare equal to the same array)
allow_reasons(grants) := sort([r | some r in {concat(":", ["role", g.role]) | some g in grants}])

# ---- approval ----------------------------------------------------------------------------

production(env) if data.environments[env].production == true

ticketed(action) if data.controlplane.catalogue.actions[action].ticketed == true

# Production mutations always go through a ticket reviewed by humans, with a fresh step-up.
# The service enforces tickets and step-up in code whatever this returns; the policy says
# what the ticket must satisfy.
needs_approval(inp) if {
	data.environments[inp.env].production == true
	data.controlplane.catalogue.actions[inp.action].ticketed == true
}

# Agents need a human-approved ticket wherever the environment says so (prod, by data).
needs_approval(inp) if {
	inp.principal.kind == "agent"
	data.controlplane.catalogue.actions[inp.action].ticketed == true
	data.environments[inp.env].agent_requires_approval == true
}

# An installer run the resource rules gate (below) needs a ticket outside production too.
needs_approval(inp) if {
	inp.action == "installer.run.execute"
	count(resource_reasons(inp)) > 0
}

approval_reasons(inp) := array.concat(
	array.concat(
		["production_mutation" | production(inp.env)],
		["agent_requires_human_approval" | inp.principal.kind == "agent"],
	),
	resource_reasons(inp),
)

# The environment's requirements over the defaults, and an app's own for this env over both
# (data.apps.<app>.approval.<env>: payments in prod needs two reviewers from two groups).
requirements(inp) := object.union(
	object.union(data.approval.defaults, object.get(data.approval.environments, inp.env, {})),
	app_requirements(inp),
)

app_requirements(inp) := data.apps[inp.resource.value.app].approval[inp.env] if {
	inp.action == "installer.run.execute"
} else := {}

# ---- resource rules: what an installer run runs (input.resource.value) --------------------

# Only in environments that gate releases (data: environments.<env>.release_gate; staging):
# - a pre-release version (`-rc`, `-beta`) needs a reviewed ticket, whoever runs it;
# - an app listed in data.apps runs without approval only for its owning team (a group).
# Runs of other apps, and resources without these members, are unchanged.
resource_reasons(inp) := array.concat(
	["pre_release" | pre_release(inp)],
	["not_app_owner" | not_app_owner(inp)],
) if {
	inp.action == "installer.run.execute"
	data.environments[inp.env].release_gate == true
} else := []

# A label after a "-" that is, or starts, "rc" or "beta" ("3.0.0-rc", "2.1-beta.2", "1.0-rc-1").
# No regex: the version is the caller's string (up to 256 KiB), and regopy's regex engine
# crashes the process on long ones (policies/README.md, "Strings the caller controls").
pre_release(inp) if {
	is_string(inp.resource.value.version)
	some label in array.slice(split(inp.resource.value.version, "-"), 1, 1000000)
	pre_release_label(label)
}

pre_release_label(label) if label in {"rc", "beta"}

pre_release_label(label) if strings.any_prefix_match(label, ["rc.", "beta."])

not_app_owner(inp) if {
	team := data.apps[inp.resource.value.app].team
	not team in object.get(inp.principal, "groups", [])
}

# ---- explain (offline tooling only; never on the request path) -----------------------------

explanation(inp) := {
	"matching_grants": matching_grants(inp),
	"denials": denials(inp, matching_grants(inp)),
	"production": production_flag(inp.env),
	"ticketed_action": ticketed_flag(inp.action),
	"needs_approval": approval_flag(inp),
}

production_flag(env) := true if production(env) else := false

ticketed_flag(action) := true if ticketed(action) else := false

approval_flag(inp) := true if needs_approval(inp) else := false
