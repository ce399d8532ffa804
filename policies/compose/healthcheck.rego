package controlplane.compose.rules.healthcheck

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "healthcheck",
	"title": "No healthcheck",
	"severity": "warn",
	"rationale": "Without a healthcheck a hung process looks healthy: restarts, depends_on: service_healthy and rolling updates cannot tell a dead service from a live one.",
	"remediation": "Add a healthcheck with a cheap test of the service's own endpoint (test, interval, timeout, retries, start_period).",
}

disabled(check) if check.disable == true

disabled(check) if check.test[0] == "NONE"

_findings_1 := [[name, ["healthcheck"], "no healthcheck defined (the image's HEALTHCHECK, if any, is not visible here)"] |
	some name
	svc := input.fields.services[name]
	not svc.healthcheck
]

_findings_2 := [[name, ["healthcheck"], "healthcheck is disabled"] |
	some name
	svc := input.fields.services[name]
	disabled(svc.healthcheck)
]

findings := array.concat(_findings_1, _findings_2)
