package controlplane.compose.tests.security_opt_missing

import rego.v1

import data.controlplane.compose.rules.security_opt_missing as rule

test_absent if {
	rule.absent({})
	rule.absent({"security_opt": []})
	not rule.absent({"security_opt": ["no-new-privileges:true"]})
}
