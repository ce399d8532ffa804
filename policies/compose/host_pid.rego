package controlplane.compose.rules.host_pid

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "host-pid",
	"title": "Host pid namespace",
	"severity": "fail",
	"rationale": "pid: host shares the host's pid namespace with the container: it sees and can signal or ptrace every process on the host, and read their environments.",
	"remediation": "Remove pid: host; use a sidecar sharing pid: service:<name> if process visibility is needed.",
}

_findings_1 := [[name, ["pid"], "pid: host"] |
	some name
	svc := input.fields.services[name]
	lower(svc.pid) == "host"
]

findings := _findings_1
