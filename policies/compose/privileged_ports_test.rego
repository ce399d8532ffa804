package controlplane.compose.tests.privileged_ports

import rego.v1

import data.controlplane.compose.rules.privileged_ports as rule

test_first_host_port if {
	rule.first_host_port("70") == 70
	rule.first_host_port("8000-8010") == 8000
	rule.first_host_port(21) == 21
	not rule.first_host_port("")
	not rule.first_host_port("${PORT}")
}

test_expected_low_ports if {
	80 in rule.expected_low_ports
	not 70 in rule.expected_low_ports
}
