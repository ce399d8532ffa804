package controlplane.compose.tests.no_new_privileges

import rego.v1

import data.controlplane.compose.rules.no_new_privileges as rule

test_option_spellings if {
	rule.nnp("no-new-privileges") == "true"
	rule.nnp("no-new-privileges:true") == "true"
	rule.nnp("no-new-privileges=true") == "true"
	rule.nnp(" NO-NEW-PRIVILEGES : FALSE ") == "false"
	not rule.nnp("seccomp:unconfined")
}

test_enabled_and_disabled if {
	rule.enabled({"security_opt": ["seccomp=p.json", "no-new-privileges:true"]})
	not rule.enabled({"security_opt": ["no-new-privileges:false"]})
	not rule.enabled({})
	rule.disabled({"security_opt": ["no-new-privileges=false"]})
	not rule.disabled({"security_opt": ["no-new-privileges"]})
}
