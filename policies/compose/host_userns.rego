package controlplane.compose.rules.host_userns

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "host-userns",
	"title": "Host user namespace",
	"severity": "fail",
	"rationale": "userns_mode: host opts the container out of the daemon's user-namespace remapping: uid 0 in the container is uid 0 on the host again, so an escape or a writable host mount is root on the host.",
	"remediation": "Remove userns_mode: host; if a workload truly needs host uids, run it on a dedicated host with an exception on record.",
}

host_userns(svc) if lower(svc.userns_mode) == "host"

_findings_1 := [[name, ["userns_mode"], "userns_mode: host"] |
	some name
	svc := input.fields.services[name]
	host_userns(svc)
]

findings := _findings_1
