package controlplane.compose.rules.bind_propagation

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "bind-propagation",
	"title": "Shared mount propagation on a bind mount",
	"severity": "fail",
	"rationale": "With shared/rshared propagation, mounts made inside the container appear on the host (a container can mount over host paths); with slave/rslave, host mounts made later (new disks, other containers' volumes) appear in the container.",
	"remediation": "Remove the propagation option (the default is rprivate); keep rslave only for agents that must see host mounts, on dedicated hosts.",
}

propagation_severity := {"shared": "fail", "rshared": "fail", "slave": "warn", "rslave": "warn"}

# The propagation mode of a bind mount (lower-case), "" when not set.
propagation(v) := lower(object.get(object.get(v, "bind", {}), "propagation", ""))

_findings_1 := [[name, ["volumes", i, "bind", "propagation"], concat("", ["bind mount ", object.get(v, "source", "?"), " at ", v.target, " has ", mode, " propagation"]), propagation_severity[mode]] |
	some name
	svc := input.fields.services[name]
	some i
	v := svc.volumes[i]
	v.type == "bind"
	_ := v.bind.propagation # set at all (cheap; without it propagation(v) is "", no mode)
	mode := propagation(v)
	propagation_severity[mode]
]

has_bind(svc) if {
	some v in svc.volumes
	v.type == "bind"
}

_not_applicable_1 := [name |
	some name
	svc := input.fields.services[name]
	not has_bind(svc)
]

findings := _findings_1

not_applicable := _not_applicable_1
