package controlplane.compose.tests.host_userns

import rego.v1

import data.controlplane.compose.rules.host_userns as rule

test_host_user_namespace if {
	rule.host_userns({"userns_mode": "host"})
	rule.host_userns({"userns_mode": "HOST"})
	not rule.host_userns({})
	not rule.host_userns({"userns_mode": ""})
}
