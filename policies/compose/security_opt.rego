package controlplane.compose.rules.security_opt

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "security-opt",
	"title": "Seccomp, AppArmor or SELinux confinement disabled",
	"severity": "fail",
	"rationale": "seccomp:unconfined exposes every system call to the container (including those behind most container escapes); apparmor:unconfined and label:disable switch off the mandatory access control that confines it; systempaths=unconfined unmasks /proc and /sys.",
	"remediation": "Remove the security_opt entry; if a syscall is missing, ship a custom seccomp profile that adds only it.",
}


# security_opt entries accept both "key:value" and "key=value".
option(raw) := [lower(lib.trim_space_safe(parts[0])), lower(lib.trim_space_safe(concat(":", array.slice(parts, 1, count(parts)))))] if {
	parts := split(replace(raw, "=", ":"), ":")
}

# Every disabling option's value contains one of these (compared lower-case).
may_disable(text) if contains(text, "unconfined")

may_disable(text) if contains(text, "disable")

disabling := {["seccomp", "unconfined"], ["apparmor", "unconfined"], ["label", "disable"], ["systempaths", "unconfined"]}

# no-new-privileges (false or missing) is the no-new-privileges rule's.

_findings_1 := [[name, ["security_opt", i], concat("", ["security_opt ", raw, " disables confinement"])] |
	some name
	svc := input.fields.services[name]
	raw_all := svc.security_opt
	some i
	raw := raw_all[i]
	may_disable(lower(raw)) # cheap: most entries (no-new-privileges, profiles) end here
	option(raw) in disabling
]

findings := _findings_1
