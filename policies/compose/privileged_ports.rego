package controlplane.compose.rules.privileged_ports

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "privileged-ports",
	"title": "Low host port published",
	"severity": "info",
	"rationale": "A container port below 1024 needs neither root nor NET_BIND_SERVICE on current engines (Docker >= 20.10 sets net.ipv4.ip_unprivileged_port_start=0 in each container's network namespace), so that is not checked. The host side still matters: a port below 1024 other than the web and DNS ports (80, 443, 53) is where legacy and administrative services listen (ftp, telnet, smtp, rpcbind, smb, ...), and a rootless engine cannot publish any of them unless the host's net.ipv4.ip_unprivileged_port_start allows it.",
	"remediation": "Publish a port >= 1024 on the host, or make sure the low port is deliberate (and, under a rootless engine, allowed by the host's sysctl).",
}

# Host ports below 1024 that services are expected to publish: the web and DNS.
expected_low_ports := {80, 443, 53}

_not_applicable_1 := [name |
	some name
	svc := input.fields.services[name]
	count(object.get(svc, "ports", [])) == 0
]

# The first host port of a "published" value ("70", "8000-8010"); undefined when it has none.
first_host_port(published) := n if {
	is_string(published)
	first := split(published, "-")[0]
	lib.matchable(first)
	regex.match(`^[0-9]{1,5}$`, first)
	n := to_number(first)
} else := published if {
	is_number(published)
}

_findings_1 := [[name, ["ports", i, "published"], concat("", ["host port ", format_int(n, 10), " < 1024 published (container port ", format_int(p.target, 10), ")"])] |
	some name
	svc := input.fields.services[name]
	some i
	p := svc.ports[i]
	n := first_host_port(p.published)
	n < 1024
	n > 0
	not n in expected_low_ports
]

findings := _findings_1

not_applicable := _not_applicable_1
