package controlplane.compose.tests.pids_limit

import rego.v1

import data.controlplane.compose.rules.pids_limit as rule

test_missing_and_unlimited if {
	rule.problem({}) == "no pids limit"
	rule.problem({"memory": 1}) == "no pids limit"
	rule.problem({"pids": -1}) == "pids limit -1 is unlimited"
	rule.problem({"pids": 0}) == "pids limit 0 is unlimited"
}

test_a_limit_passes if {
	not rule.problem({"pids": 200})
}
