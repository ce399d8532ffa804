package controlplane.compose.rules.cgroup

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "cgroup",
	"title": "Not the default cgroup",
	"severity": "fail",
	"rationale": "cgroup: host runs the container in the host's cgroup namespace, where it sees (and with write access can change) the whole host's cgroup tree; cgroup_parent places it under a cgroup of your choosing, outside the limits and accounting the daemon sets up.",
	"remediation": "Remove cgroup: host and cgroup_parent; set limits with deploy.resources instead.",
}

host_cgroup(svc) if lower(svc.cgroup) == "host"

custom_parent(svc) if svc.cgroup_parent != ""

_findings_1 := [[name, ["cgroup"], "cgroup: host"] |
	some name
	svc := input.fields.services[name]
	host_cgroup(svc)
]

# An object, not a compact finding (policies/compose/README.md): cgroup_parent may be an
# integer, and the message's concat then fails; in an object the failure reaches the preflight
# (the rule's cells say error), in a compact finding regopy would drop the finding.
_findings_2 := [{"service": name, "path": ["cgroup_parent"], "message": concat("", ["cgroup_parent: ", svc.cgroup_parent]), "severity": "warn"} |
	some name
	svc := input.fields.services[name]
	custom_parent(svc)
]

findings := array.concat(_findings_1, _findings_2)
