package controlplane.compose.rules.devices

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "devices",
	"title": "Host devices mapped",
	"severity": "warn",
	"rationale": "A mapped device is direct access to host hardware and kernel drivers. Raw memory and block devices (/dev/mem, /dev/sda, /dev/nvme0n1, ...) give full control of the host and its disks.",
	"remediation": "Remove the device mapping; if hardware access is required (GPU, USB, TUN), map the single device node needed, with the narrowest permissions, and never raw memory or disks.",
}

critical_patterns := [`^/dev/(mem|kmem|port)$`, `^/dev/(sd|hd|vd|xvd)[a-z]+[0-9]*$`, `^/dev/nvme[0-9]+`, `^/dev/(disk|mapper)/`, `^/dev/(loop|dm-|md)[0-9]+`, `^/dev/?$`]

# One match for all the patterns (each anchored on its own): regex.match compiles its pattern on
# every call, so one call instead of one per pattern.
critical_regex := concat("|", critical_patterns)

# Only a source within lib.max_match meets the pattern; no device node has a longer path, so a
# longer one fails (device_severity) rather than being guessed at.
critical(source) if {
	lib.matchable(source)
	regex.match(critical_regex, source)
}

_findings_1 := [[name, ["devices", i], concat("", ["device ", d.source, " mapped to ", d.target]), severity] |
	some name
	svc := input.fields.services[name]
	d_all := svc.devices
	some i
	d := d_all[i]
	severity := device_severity(d.source)
]

# The commonest critical nodes, without a regex (the set is a subset of critical_patterns').
critical_nodes := {"/dev/mem", "/dev/kmem", "/dev/port"}

device_severity(source) := "fail" if {
	source in critical_nodes
} else := "fail" if {
	critical(source)
} else := "fail" if {
	not lib.matchable(source)
} else := "warn"

findings := _findings_1
