package controlplane.compose.rules.host_ipc

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "host-ipc",
	"title": "Host ipc namespace",
	"severity": "fail",
	"rationale": "ipc: host shares the host's ipc namespace with the container: it can read and write the shared memory and semaphores of host processes.",
	"remediation": "Remove ipc: host; use ipc: shareable / service:<name> between the containers that need it.",
}

_findings_1 := [[name, ["ipc"], "ipc: host"] |
	some name
	svc := input.fields.services[name]
	lower(svc.ipc) == "host"
]

findings := _findings_1
