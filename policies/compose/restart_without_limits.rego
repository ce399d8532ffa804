package controlplane.compose.rules.restart_without_limits

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "restart-without-limits",
	"title": "restart: always without resource limits",
	"severity": "info",
	"rationale": "restart: always brings a crashing or leaking container back forever, even after a manual stop once the daemon restarts; with no memory or CPU limit nothing bounds what each round costs the host.",
	"remediation": "Set deploy.resources.limits, and prefer restart: unless-stopped or on-failure:<n>.",
}

# The rule speaks only about services that restart always.
_not_applicable_1 := [name |
	some name
	svc := input.fields.services[name]
	not svc.restart == "always"
]

_findings_1 := [[name, ["restart"], "restart: always with no memory or CPU limit"] |
	some name
	svc := input.fields.services[name]
	svc.restart == "always"
	limits := lib.limits(svc)
	not limits.memory
	not limits.cpus
]

findings := _findings_1

not_applicable := _not_applicable_1
