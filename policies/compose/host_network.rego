package controlplane.compose.rules.host_network

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "host-network",
	"title": "Host network namespace",
	"severity": "fail",
	"rationale": "network_mode: host shares the host's network namespace with the container: it can bind any host port, reach services listening on localhost and sniff host traffic, and published ports are bypassed.",
	"remediation": "Remove network_mode: host; use a user-defined network and publish only the ports needed.",
}

_findings_1 := [[name, ["network_mode"], "network_mode: host"] |
	some name
	svc := input.fields.services[name]
	lower(svc.network_mode) == "host"
]

findings := _findings_1
