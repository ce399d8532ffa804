package controlplane.compose.rules.run_as_root

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "run-as-root",
	"title": "Running as root",
	"severity": "fail",
	"rationale": "A process running as uid 0 inside the container is root on the host if it escapes (without user namespaces), and can modify everything in its image and mounted volumes.",
	"remediation": "Set user: to a non-root uid:gid (e.g. user: \"10001:10001\") and make the image work without root.",
}

root_users := {"root", "0"}

_findings_1 := [[name, ["user"], concat("", ["user: ", svc.user, " runs as root"])] |
	some name
	svc := input.fields.services[name]
	split(svc.user, ":")[0] in root_users
]

# Without user: the image decides, and most images run as root.
_findings_2 := [[name, ["user"], "no user set: the image default applies (often root)", "warn"] |
	some name
	svc := input.fields.services[name]
	object.get(svc, "user", "") == ""
]

findings := array.concat(_findings_1, _findings_2)
