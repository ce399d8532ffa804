package controlplane.compose.rules.resource_limits

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "resource-limits",
	"title": "No memory or CPU limits",
	"severity": "warn",
	"rationale": "Without a memory limit one leaking container can push the host into the OOM killer and take its neighbours down; without a CPU limit it can starve them.",
	"remediation": "Set deploy.resources.limits.memory and deploy.resources.limits.cpus (warn without them; --strict fails); mem_limit and cpus are accepted and folded into deploy.resources.",
}

_findings_1 := [[name, ["deploy", "resources", "limits", "memory"], "no memory limit"] |
	some name
	svc := input.fields.services[name]
	not svc.deploy.resources.limits.memory
]

_findings_2 := [[name, ["deploy", "resources", "limits", "cpus"], "no CPU limit"] |
	some name
	svc := input.fields.services[name]
	not svc.deploy.resources.limits.cpus
]

findings := array.concat(_findings_1, _findings_2)
