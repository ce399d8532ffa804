# Unit tests of the policy logic with synthetic projected grants (the engine's projection of
# policies/data is exercised by the decision cases under examples/decisions/).
# Most tests call decide({...}) directly; `with input as V` also works under `cpctl policy test`
# (the runner evaluates such a test with the input set to V: see policies/README.md).
package controlplane.authz_test

import rego.v1

import data.controlplane.authz

all_envs := {"role": "operator", "envs": ["*"]}

human_only := {"role": "operator", "envs": ["*"], "kinds": ["human"]}

dev_only := {"role": "ci", "envs": ["dev", "staging"]}

admin_any := {"role": "admin", "envs": ["*"], "kinds": ["human"], "scope": "any"}

req(subject, kind, action, env, grants) := {
	"principal": {"subject_id": subject, "kind": kind, "roles": [], "groups": [], "grants": grants,
	              "step_up": {"verified": true, "at": 0, "age_s": 10}},
	"action": action,
	"resource": {"id": "r1", "kind": "installer"},
	"env": env,
	"context": {},
}

owned(r, owner) := object.union(r, {"resource": {"id": "t1", "kind": "approval", "owner": owner}})

# ---- allow / deny basics -------------------------------------------------------------------

test_read_allowed_with_grant if {
	d := authz.decide(req("carol", "human", "databases.list", "prod", [all_envs]))
	d.decision == "allow"
	d.reasons == ["role:operator"]
}

test_no_grant_denied if {
	d := authz.decide(req("carol", "human", "databases.list", "dev", []))
	d.decision == "deny"
	d.reasons == ["no_grant"]
}

test_missing_grants_field_denied if {
	d := authz.decide({"principal": {"subject_id": "x", "kind": "human"}, "action": "tasks.read",
	                   "resource": {"kind": "task"}, "env": "dev", "context": {}})
	d.decision == "deny"
}

test_unknown_env_denied if {
	d := authz.decide(req("alice", "human", "databases.list", "moon", [all_envs]))
	d.decision == "deny"
	"unknown_env" in d.reasons
}

test_unknown_action_denied if {
	d := authz.decide(req("alice", "human", "rockets.launch", "dev", [all_envs]))
	"unknown_action" in d.reasons
}

test_env_restricted_grant_outside_env_denied if {
	authz.decide(req("ci-bot", "service", "installer.run.execute", "prod", [dev_only])).decision == "deny"
}

test_env_restricted_grant_inside_env_allowed if {
	authz.decide(req("ci-bot", "service", "installer.run.execute", "staging", [dev_only])).decision == "allow"
}

test_kind_restricted_grant_rejects_other_kind if {
	authz.decide(req("agent-7", "agent", "installer.run.execute", "dev", [human_only])).decision == "deny"
}

test_kind_restricted_grant_accepts_kind if {
	authz.decide(req("alice", "human", "installer.run.execute", "dev", [human_only])).decision == "allow"
}

test_allow_reasons_name_each_role_once if {
	g2 := {"role": "viewer", "envs": ["*"]}
	d := authz.decide(req("alice", "human", "tasks.read", "dev", [all_envs, g2, all_envs]))
	d.reasons == ["role:operator", "role:viewer"]
}

# ---- production and approval -----------------------------------------------------------------

test_prod_mutation_requires_approval if {
	d := authz.decide(req("alice", "human", "installer.run.execute", "prod", [all_envs]))
	d.decision == "require_approval"
	d.reasons == ["production_mutation"]
}

test_prod_approval_needs_an_sre_approver if {
	d := authz.decide(req("alice", "human", "installer.run.execute", "prod", [all_envs]))
	d.approval.quorum == 1
	d.approval.require_groups == ["sre-approvers"]
	d.approval.step_up == true
	d.approval.humans_only == true
}

test_prod_approval_has_ttls if {
	d := authz.decide(req("alice", "human", "installer.run.execute", "prod", [all_envs]))
	d.approval.ttl_s > 0
	d.approval.pending_ttl_s >= d.approval.ttl_s
}

test_staging_mutation_allowed if {
	authz.decide(req("alice", "human", "installer.run.execute", "staging", [all_envs])).decision == "allow"
}

test_prod_read_allowed if {
	authz.decide(req("alice", "human", "storage.list", "prod", [all_envs])).decision == "allow"
}

test_prod_mutation_without_grant_denied_not_approval if {
	authz.decide(req("carol", "human", "installer.run.execute", "prod", [])).decision == "deny"
}

test_agent_prod_mutation_requires_human_approval if {
	d := authz.decide(req("agent-7", "agent", "installer.run.execute", "prod", [all_envs]))
	d.decision == "require_approval"
	"agent_requires_human_approval" in d.reasons
	d.approval.humans_only == true
}

test_agent_dev_mutation_allowed_with_grant if {
	authz.decide(req("agent-7", "agent", "installer.run.execute", "dev", [all_envs])).decision == "allow"
}

test_ticket_workflow_not_ticketed_in_prod if {
	r := owned(req("bob", "human", "approvals.review", "prod", [all_envs]), "alice")
	authz.decide(r).decision == "allow"
}

# ---- reviews -----------------------------------------------------------------------------

test_agent_never_reviews if {
	r := owned(req("agent-7", "agent", "approvals.review", "dev", [all_envs]), "alice")
	d := authz.decide(r)
	d.decision == "deny"
	"reviewer_not_human" in d.reasons
}

test_service_never_reviews if {
	r := owned(req("ci-bot", "service", "approvals.review", "prod", [all_envs]), "alice")
	"reviewer_not_human" in authz.decide(r).reasons
}

test_self_review_denied if {
	r := owned(req("bob", "human", "approvals.review", "prod", [all_envs]), "bob")
	d := authz.decide(r)
	d.decision == "deny"
	d.reasons == ["self_review"]
}

test_admin_self_review_denied_too if {
	r := owned(req("erin", "human", "approvals.review", "prod", [admin_any]), "erin")
	authz.decide(r).reasons == ["self_review"]
}

# ---- creating tickets ------------------------------------------------------------------------

test_create_for_self_allowed if {
	r := owned(req("alice", "human", "approvals.create", "prod", [all_envs]), "alice")
	authz.decide(r).decision == "allow"
}

test_create_without_owner_means_self if {
	authz.decide(req("alice", "human", "approvals.create", "prod", [all_envs])).decision == "allow"
}

test_create_for_other_denied_without_any_scope if {
	r := owned(req("alice", "human", "approvals.create", "prod", [all_envs]), "bob")
	authz.decide(r).reasons == ["create_for_other"]
}

test_admin_creates_for_anyone if {
	r := owned(req("erin", "human", "approvals.create", "prod", [admin_any]), "alice")
	authz.decide(r).decision == "allow"
}

test_all_deny_reasons_reported if {
	r := owned(req("agent-7", "agent", "approvals.review", "moon", []), "agent-7")
	d := authz.decide(r)
	d.reasons == ["unknown_env", "reviewer_not_human", "self_review", "no_grant"]
}

# ---- shape -------------------------------------------------------------------------------

test_decision_always_has_three_fields if {
	d := authz.decide(req("carol", "human", "tasks.read", "dev", []))
	object.keys(d) == {"decision", "reasons", "approval"}
}

test_explain_lists_matching_grants if {
	e := authz.explanation(req("alice", "human", "tasks.read", "dev", [all_envs, dev_only]))
	count(e.matching_grants) == 2
	e.production == false
}

test_explain_flags_a_production_mutation if {
	e := authz.explanation(req("alice", "human", "installer.run.execute", "prod", [all_envs]))
	e.production == true
	e.ticketed_action == true
	e.needs_approval == true
	e.denials == []
}

# `with input as V` works in the runner: the test is evaluated with the input set to V.
test_explain_entrypoint_reads_input if {
	authz.explain.production == true with input as req("alice", "human", "tasks.read", "prod", [all_envs])
}

# ---- resource rules: an installer run's app and version (input.resource.value) -------------

run_of(r, app, version, groups) := object.union(r, {
	"principal": object.union(r.principal, {"groups": groups}),
	"resource": {"id": "t1", "kind": "installer_run", "value": {"app": app, "version": version}},
})

test_owning_team_runs_its_app_in_staging if {
	r := run_of(req("alice", "human", "installer.run.execute", "staging", [all_envs]), "payments", "2.4.0", ["payments-team"])
	authz.decide(r).decision == "allow"
}

test_others_need_a_ticket_for_a_listed_app_in_staging if {
	r := run_of(req("erin", "human", "installer.run.execute", "staging", [admin_any]), "payments", "2.4.0", ["sre-approvers"])
	d := authz.decide(r)
	d.decision == "require_approval"
	d.reasons == ["not_app_owner"]
}

test_pre_release_needs_a_ticket_in_staging_even_for_the_team if {
	r := run_of(req("alice", "human", "installer.run.execute", "staging", [all_envs]), "payments", "2.5.0-rc.1", ["payments-team"])
	authz.decide(r).reasons == ["pre_release"]
}

test_pre_release_of_any_app_and_not_owner_both_reported if {
	r := run_of(req("erin", "human", "installer.run.execute", "staging", [admin_any]), "checkout", "1.0.0-beta", [])
	authz.decide(r).reasons == ["pre_release", "not_app_owner"]
}

test_unlisted_release_and_dev_unchanged if {
	r := run_of(req("alice", "human", "installer.run.execute", "staging", [all_envs]), "web", "3.0.0-rcx", [])
	authz.decide(r).decision == "allow"
	dev := run_of(req("alice", "human", "installer.run.execute", "dev", [all_envs]), "payments", "2.5.0-rc.1", [])
	authz.decide(dev).decision == "allow"
}

test_pre_release_labels if {
	every v in ["1.0-rc", "1.0-rc.2", "1.0-rc-1", "2.1-beta", "2.1-beta.3", "1-2-beta", "1.0-rc-"] {
		authz.pre_release({"resource": {"value": {"version": v}}})
	}
	released := [v |
		some v in ["1.0", "1.0-rcx", "1.0-src", "1.0-rc1", "1.0rc", "rc", "1.0-release", "1.0-"]
		authz.pre_release({"resource": {"value": {"version": v}}})
	]
	released == []
}

test_a_version_that_is_not_a_string_is_no_pre_release if {
	r := run_of(req("alice", "human", "installer.run.execute", "staging", [all_envs]), "web", 3, [])
	authz.decide(r).decision == "allow"
}

test_payments_in_prod_needs_two_reviewers_from_two_groups if {
	r := run_of(req("alice", "human", "installer.run.execute", "prod", [all_envs]), "payments", "2.4.0", ["payments-team"])
	d := authz.decide(r)
	d.reasons == ["production_mutation"]
	d.approval.quorum == 2
	d.approval.require_groups == ["sre-approvers", "security"]
}
