package controlplane.compose.tests.bind_propagation

import rego.v1

import data.controlplane.compose.rules.bind_propagation as rule

test_propagation_modes if {
	rule.propagation({"type": "bind", "bind": {"propagation": "RShared"}}) == "rshared"
	rule.propagation({"type": "bind"}) == ""
	rule.propagation_severity.shared == "fail"
	rule.propagation_severity.rshared == "fail"
	rule.propagation_severity.slave == "warn"
	rule.propagation_severity.rslave == "warn"
	not rule.propagation_severity.rprivate
}

test_has_bind if {
	rule.has_bind({"volumes": [{"type": "volume", "target": "/a"}, {"type": "bind", "source": "./x", "target": "/b"}]})
	not rule.has_bind({"volumes": [{"type": "tmpfs", "target": "/t"}]})
	not rule.has_bind({})
}
