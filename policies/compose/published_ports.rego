package controlplane.compose.rules.published_ports

import rego.v1

meta := {
	"id": "published-ports",
	"title": "Ports published on all interfaces",
	"severity": "warn",
	"rationale": "A port without host_ip is published on 0.0.0.0 and [::], reachable from every network the host is on; Docker's iptables rules bypass host firewalls such as ufw. That exposure must be deliberate (--strict makes it fail).",
	"remediation": "Bind to a specific address (host_ip: 127.0.0.1 behind a reverse proxy, or the internal interface), or do not publish the port and use a network instead.",
}

all_interfaces := {"", "0.0.0.0", "::", "[::]"}

_not_applicable_1 := [name |
	some name
	svc := input.fields.services[name]
	count(object.get(svc, "ports", [])) == 0
]

# Published on every interface: warn, in production too (a front end on 0.0.0.0 is usually
# deliberate: 132 of the 136 services of the corpus that publish a port do so); --strict fails.
port_severity := "warn"

# A range is one entry (target..target_end) and one finding.
target_text(p) := concat("-", [format_int(p.target, 10), format_int(p.target_end, 10)]) if {
	p.target_end
} else := format_int(p.target, 10)

_findings_1 := [[name, ["ports", i], concat("", ["port ", target_text(p), "/", object.get(p, "protocol", "tcp"), " published on all interfaces as ", published]), port_severity] |
	some name
	svc := input.fields.services[name]
	some i
	p := svc.ports[i]
	object.get(p, "host_ip", "") in all_interfaces
	published := object.get(p, "published", "an ephemeral port")
]

findings := _findings_1

not_applicable := _not_applicable_1
