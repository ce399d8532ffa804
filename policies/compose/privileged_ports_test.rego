package controlplane.compose.tests.privileged_ports

import rego.v1

import data.controlplane.compose.rules.privileged_ports as rule

test_what_allows_low_ports if {
	rule.low_ports_allowed({"cap_add": ["CAP_NET_BIND_SERVICE"]})
	rule.low_ports_allowed({"sysctls": {"net.ipv4.ip_unprivileged_port_start": "0"}})
	not rule.low_ports_allowed({"sysctls": {"net.ipv4.ip_unprivileged_port_start": "1024"}})
	not rule.low_ports_allowed({"cap_add": ["CHOWN"]})
}

test_severity_depends_on_cap_drop if {
	rule.port_severity({"cap_drop": ["all"]}) == "warn"
	rule.port_severity({"cap_drop": ["NET_RAW"]}) == "info"
	rule.port_severity({}) == "info"
}
