package controlplane.compose.rules.read_only_rootfs

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "read-only-rootfs",
	"title": "Root filesystem writable",
	"severity": "warn",
	"rationale": "A writable root filesystem lets an attacker drop tools and persist changes in the container; a read-only one forces state into declared volumes.",
	"remediation": "Set read_only: true and mount tmpfs (tmpfs: [/tmp]) or volumes for the paths the service writes.",
}

_findings_1 := [[name, ["read_only"], "read_only is not true"] |
	some name
	svc := input.fields.services[name]
	not svc.read_only == true
]

findings := _findings_1
