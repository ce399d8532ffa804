package controlplane.compose.rules.privileged_ports

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "privileged-ports",
	"title": "Privileged container port published",
	"severity": "info",
	"rationale": "Listening on a port below 1024 inside the container needs root or CAP_NET_BIND_SERVICE: a service that publishes one either runs as root or keeps a capability it could do without. With cap_drop: [ALL] and no NET_BIND_SERVICE the service cannot bind it at all.",
	"remediation": "Listen on a port >= 1024 inside the container and publish it as the low port (\"80:8080\"), or add NET_BIND_SERVICE explicitly next to cap_drop: [ALL].",
}

# The sysctl that lets unprivileged processes bind low ports in the container's namespace.
unprivileged_ports(svc) if {
	start := object.get(object.get(svc, "sysctls", {}), "net.ipv4.ip_unprivileged_port_start", "")
	start != ""
	to_number(start) <= 1
}

# True when the service can bind a low port without root (NET_BIND_SERVICE added, or the sysctl).
low_ports_allowed(svc) if "NET_BIND_SERVICE" in lib.caps(svc, "cap_add")

low_ports_allowed(svc) if unprivileged_ports(svc)

# With every capability dropped a low port cannot be bound without root: that breaks at start.
port_severity(svc) := "warn" if {
	"ALL" in lib.caps(svc, "cap_drop")
} else := "info"

story := {
	"warn": " < 1024 with cap_drop ALL and no NET_BIND_SERVICE: it cannot be bound unless the process is root",
	"info": " < 1024 needs root or NET_BIND_SERVICE",
}

_not_applicable_1 := [name |
	some name
	svc := input.fields.services[name]
	count(object.get(svc, "ports", [])) == 0
]

_findings_1 := [{"service": name, "path": ["ports", i, "target"], "message": concat("", ["container port ", format_int(p.target, 10), story[severity]]), "severity": severity} |
	some name
	svc := input.fields.services[name]
	ports := object.get(svc, "ports", [])
	some i
	p := ports[i]
	p.target < 1024
	not low_ports_allowed(svc)
	severity := port_severity(svc)
]

findings := _findings_1

not_applicable := _not_applicable_1
