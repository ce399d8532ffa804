package controlplane.compose.rules.waivers

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "waivers",
	"title": "Waiver not valid",
	"severity": "fail",
	"rationale": "A waiver (x-controlplane-waivers: [{rule, service, reason, expires}]) accepts a known risk: the waived finding stays in the report, marked waived with its reason. A waiver without a reason accepts nothing anyone can review, an expired one has run out, and some rules may not be waived in production at all (never_waived_in_prod): such a waiver lifts nothing and is a finding itself.",
	"remediation": "Give the waiver a reason and an expiry date in the future (RFC 3339: 2027-03-31), or fix what it waives; a rule in never_waived_in_prod must be fixed for production.",
}

# Rules no waiver lifts in production: the platform team's decision, edited here.
never_waived_in_prod := {"privileged", "host-network", "host-pid", "host-ipc", "host-userns"}

# The preflight's verdict on each waiver's expiry, by index: "expired" or "invalid" (not an
# RFC 3339 date or date-time); absent when the waiver has not expired or has no expiry.
_states := object.get(input, "waiver_states", {})

_waivers := object.get(input.fields, lib.waivers_key, [])

_ptr(i) := concat("/", ["", lib.waivers_key, format_int(i, 10)])

no_reason(w) if lib.trim_space_safe(object.get(w, "reason", "")) == ""

may_not_be_waived(w) if {
	lib.is_prod
	w.rule in never_waived_in_prod
}

# Objects, not compact findings (policies/compose/README.md): this rule's findings decide which
# waivers lift nothing, and in a compact finding regopy would drop one whose message failed
# instead of failing the rule.
_findings_1 := [{"service": w.service, "pointer": _ptr(i), "message": concat("", ["waiver of ", w.rule, " has no reason"])} |
	some i
	w := _waivers[i]
	_ := input.fields.services[w.service]
	no_reason(w)
]

_findings_2 := [{"service": w.service, "pointer": _ptr(i), "message": concat("", ["waiver of ", w.rule, " expired on ", w.expires])} |
	some i
	w := _waivers[i]
	_ := input.fields.services[w.service]
	_states[format_int(i, 10)] == "expired"
]

_findings_3 := [{"service": w.service, "pointer": _ptr(i), "message": concat("", ["waiver of ", w.rule, ": expires is not an RFC 3339 date or date-time: ", w.expires])} |
	some i
	w := _waivers[i]
	_ := input.fields.services[w.service]
	_states[format_int(i, 10)] == "invalid"
]

_findings_4 := [{"service": w.service, "pointer": _ptr(i), "message": concat("", [w.rule, " may not be waived in ", input.env])} |
	some i
	w := _waivers[i]
	_ := input.fields.services[w.service]
	may_not_be_waived(w)
]

_waived_services := [w.service | some w in _waivers]

_not_applicable_1 := [name |
	some name
	_ := input.fields.services[name] # (bound, not tested: a test of the value costs ~35 us a service)
	not name in _waived_services
]

findings := array.concat(array.concat(_findings_1, _findings_2), array.concat(_findings_3, _findings_4))

not_applicable := _not_applicable_1
