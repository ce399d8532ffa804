package controlplane.compose.rules.cap_drop_all

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "cap-drop-all",
	"title": "Default capabilities not dropped",
	"severity": "warn",
	"rationale": "Docker grants 14 capabilities by default (CHOWN, DAC_OVERRIDE, NET_RAW, SETUID, ...); most services need none of them. Dropping ALL and adding back only what is needed shrinks what an exploited process can do.",
	"remediation": "Add cap_drop: [ALL] and list the few capabilities the service needs under cap_add.",
}

_findings_1 := [[name, ["cap_drop"], "cap_drop does not include ALL"] |
	some name
	svc := input.fields.services[name]
	not drops_all(svc)
]

# (No set of the service's capabilities: regopy builds a set slowly, and one entry decides.)
drops_all(svc) if {
	some raw in svc.cap_drop
	trim_prefix(upper(raw), "CAP_") == "ALL"
}

findings := _findings_1
