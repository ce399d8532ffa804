package controlplane.compose.tests.restart_max_attempts

import rego.v1

import data.controlplane.compose.rules.restart_max_attempts as rule

test_short_syntax if {
	rule.unbounded_restart({"restart": "on-failure"})
	not rule.unbounded_restart({"restart": "on-failure:3"})
	rule.uses_on_failure({"restart": "on-failure:3"})
	not rule.uses_on_failure({"restart": "always"})
}

test_deploy_restart_policy if {
	rule.unbounded_policy({"deploy": {"restart_policy": {"condition": "on-failure"}}})
	not rule.unbounded_policy({"deploy": {"restart_policy": {"condition": "on-failure", "max_attempts": 5}}})
	not rule.unbounded_policy({"deploy": {"restart_policy": {"condition": "any"}}})
}
