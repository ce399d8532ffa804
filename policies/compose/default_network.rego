package controlplane.compose.rules.default_network

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "default-network",
	"title": "Default network only",
	"severity": "info",
	"rationale": "A service that names no network joins the project's default network, where every other service of the project can reach every one of its ports: the database is as reachable from the public-facing proxy as from the application.",
	"remediation": "Declare networks per tier (frontend, backend) and attach each service only to the networks it needs; mark backend networks internal: true.",
}

# On the default network only: no networks and no network_mode.
default_only(svc) if {
	count(object.get(svc, "networks", {})) == 0
	object.get(svc, "network_mode", "") == ""
}

_findings_1 := [[name, ["networks"], "no networks: attached to the project's default network only"] |
	some name
	svc := input.fields.services[name]
	default_only(svc)
]

# network_mode (host, none, service:x, container:x) replaces networks altogether.
_not_applicable_1 := [name |
	some name
	svc := input.fields.services[name]
	svc.network_mode != ""
]

findings := _findings_1

not_applicable := _not_applicable_1
