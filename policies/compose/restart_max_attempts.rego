package controlplane.compose.rules.restart_max_attempts

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "restart-max-attempts",
	"title": "restart on-failure without a maximum",
	"severity": "info",
	"rationale": "on-failure without a count restarts a crashing service forever: a crash loop keeps consuming CPU, logs and connections to its dependencies instead of stopping where an operator notices.",
	"remediation": "Give the count: restart: on-failure:5, or deploy.restart_policy.max_attempts.",
}

uses_on_failure(svc) if startswith(svc.restart, "on-failure")

uses_on_failure(svc) if svc.deploy.restart_policy.condition == "on-failure"

unbounded_restart(svc) if svc.restart == "on-failure"

unbounded_policy(svc) if {
	policy := svc.deploy.restart_policy
	policy.condition == "on-failure"
	object.get(policy, "max_attempts", 0) == 0
}

_findings_1 := [[name, ["restart"], "restart: on-failure without a maximum retry count"] |
	some name
	svc := input.fields.services[name]
	unbounded_restart(svc)
]

_findings_2 := [[name, ["deploy", "restart_policy"], "deploy.restart_policy on-failure without max_attempts"] |
	some name
	svc := input.fields.services[name]
	unbounded_policy(svc)
]

_not_applicable_1 := [name |
	some name
	svc := input.fields.services[name]
	not uses_on_failure(svc)
]

findings := array.concat(_findings_1, _findings_2)

not_applicable := _not_applicable_1
