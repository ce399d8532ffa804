package controlplane.compose.rules.capabilities

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "capabilities",
	"title": "Dangerous capabilities added",
	"severity": "fail",
	"rationale": "Capabilities such as SYS_ADMIN, NET_ADMIN, SYS_PTRACE or SYS_MODULE (and ALL) break container isolation: mounting filesystems, reconfiguring host networking, tracing other processes, loading kernel modules.",
	"remediation": "Remove the capability from cap_add, or isolate the workload that truly needs it on dedicated hosts with an exception on record.",
}

dangerous := {"ALL", "SYS_ADMIN", "NET_ADMIN", "SYS_MODULE", "SYS_PTRACE", "SYS_RAWIO", "SYS_BOOT", "SYS_TIME", "DAC_READ_SEARCH", "BPF", "PERFMON", "MAC_ADMIN", "MAC_OVERRIDE", "SYSLOG", "LINUX_IMMUTABLE", "SYS_RESOURCE", "BLOCK_SUSPEND", "WAKE_ALARM", "AUDIT_CONTROL", "CHECKPOINT_RESTORE"}

# Other added capabilities are reported, not failed.
told := {
	true: {"text": "", "severity": "fail"},
	false: {"text": " (not in the dangerous set)", "severity": "info"},
}

_findings_1 := [[name, ["cap_add", i], concat("", ["cap_add: ", cap, told[bad].text]), told[bad].severity] |
	some name
	svc := input.fields.services[name]
	raw_all := svc.cap_add
	some i
	raw := raw_all[i]
	cap := trim_prefix(upper(raw), "CAP_")
	bad := cap in dangerous
]

findings := _findings_1
