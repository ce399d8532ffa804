package controlplane.compose.rules.pids_limit

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "pids-limit",
	"title": "No process limit",
	"severity": "warn",
	"rationale": "Without a pids limit one container can fork until the host's process table is full (a fork bomb, or a leak of threads), and every other container and the host stop being able to start processes.",
	"remediation": "Set pids_limit (or deploy.resources.limits.pids) to a bound suited to the service, e.g. 200; -1 and 0 mean unlimited.",
}

problem(limits) := "no pids limit" if {
	not is_number(limits.pids)
} else := concat("", ["pids limit ", format_int(limits.pids, 10), " is unlimited"]) if {
	limits.pids <= 0
}

_findings_1 := [[name, ["deploy", "resources", "limits", "pids"], message] |
	some name
	svc := input.fields.services[name]
	message := problem(lib.limits(svc))
]

findings := _findings_1
