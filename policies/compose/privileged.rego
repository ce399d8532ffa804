package controlplane.compose.rules.privileged

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "privileged",
	"title": "Privileged containers",
	"severity": "fail",
	"rationale": "privileged: true gives the container every capability and all host devices and disables seccomp, AppArmor and SELinux confinement: a process that escapes it owns the host.",
	"remediation": "Remove privileged: true; add only the capabilities (cap_add) or devices the workload needs.",
}

_findings_1 := [[name, ["privileged"], "privileged: true"] |
	some name
	svc := input.fields.services[name]
	svc.privileged == true
]

findings := _findings_1
