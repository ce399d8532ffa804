package controlplane.compose.tests.default_network

import rego.v1

import data.controlplane.compose.rules.default_network as rule

test_default_network_only if {
	rule.default_only({})
	rule.default_only({"networks": {}})
	not rule.default_only({"networks": {"backend": null}})
	not rule.default_only({"network_mode": "none"})
}
