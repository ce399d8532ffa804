package controlplane.compose.tests.cgroup

import rego.v1

import data.controlplane.compose.rules.cgroup as rule

test_host_cgroup if {
	rule.host_cgroup({"cgroup": "host"})
	not rule.host_cgroup({"cgroup": "private"})
	not rule.host_cgroup({})
}

test_cgroup_parent if {
	rule.custom_parent({"cgroup_parent": "/custom"})
	not rule.custom_parent({})
}
