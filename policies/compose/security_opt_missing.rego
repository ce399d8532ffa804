package controlplane.compose.rules.security_opt_missing

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "security-opt-missing",
	"title": "No security_opt",
	"severity": "info",
	"rationale": "A service without security_opt runs with only the runtime's defaults: the default seccomp and AppArmor profiles (when the host has them) and no no-new-privileges. Stating the confinement makes it reviewable and keeps it when the host's defaults change.",
	"remediation": "Add security_opt with at least no-new-privileges:true, and a seccomp/AppArmor profile where the service needs a narrower one.",
}

absent(svc) if count(object.get(svc, "security_opt", [])) == 0

_findings_1 := [[name, ["security_opt"], "security_opt is absent: only the runtime's defaults apply"] |
	some name
	svc := input.fields.services[name]
	absent(svc)
]

findings := _findings_1
