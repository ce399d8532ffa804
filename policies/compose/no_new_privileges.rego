package controlplane.compose.rules.no_new_privileges

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "no-new-privileges",
	"title": "no-new-privileges not set",
	"severity": "warn",
	"rationale": "Without no-new-privileges a process in the container can gain privileges through setuid/setgid binaries or file capabilities (sudo, su, ping, a planted binary): the usual second step of an exploit. Common scanners rate it high.",
	"remediation": "Add security_opt: [\"no-new-privileges:true\"] (it breaks only images that rely on setuid binaries at run time).",
}


# The value of the no-new-privileges option of one security_opt entry ("true" for the bare flag);
# undefined for other options. Both "key:value" and "key=value" are accepted.
nnp(raw) := value if {
	text := lower(lib.trim_space_safe(raw))
	contains(text, "no-new-privileges") # the other options (seccomp, apparmor, label) end here
	value := _nnp(text)
}

_nnp(text) := "true" if {
	text == "no-new-privileges"
} else := value if {
	parts := split(replace(text, "=", ":"), ":")
	count(parts) == 2
	lib.trim_space_safe(parts[0]) == "no-new-privileges"
	value := lib.trim_space_safe(parts[1])
}

# Missing: warn, in production too (276 of the corpus's 278 services lack it: a hygiene rule
# that --strict makes fail); an explicit false fails everywhere.
missing_severity := "warn"

# What an nnp value says: on or off (other values say neither).
switch := {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}

# True when one of the entries enables it.
enabled(svc) if {
	some raw in object.get(svc, "security_opt", [])
	switch[nnp(raw)] == "on"
}

# True when one of the entries disables it explicitly.
disabled(svc) if {
	some raw in object.get(svc, "security_opt", [])
	switch[nnp(raw)] == "off"
}

# Each service's entries are read once: [name, index, raw, on/off] for every entry that
# switches no-new-privileges.
_switches := [[name, i, raw, state] |
	some name
	svc := input.fields.services[name]
	some i
	raw := svc.security_opt[i]
	v := nnp(raw)
	state := switch[v]
]

_findings_1 := [[s[0], ["security_opt", s[1]], concat("", ["security_opt ", s[2], " lets processes gain privileges"]), "fail"] |
	some s in _switches
	s[3] == "off"
]

_switched := [s[0] | some s in _switches]

_findings_2 := [[name, ["security_opt"], "no-new-privileges is not set to true", missing_severity] |
	some name
	_ := input.fields.services[name] # (bound, not tested: a test of the value costs ~35 us a service)
	not name in _switched
]

findings := array.concat(_findings_1, _findings_2)
