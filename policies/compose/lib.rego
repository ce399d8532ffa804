# Shared helpers of the compose preflight rules (not a rule: its package is not under .rules).
package controlplane.compose.lib

import rego.v1

services := object.get(object.get(input, "fields", {}), "services", {})

top(kind) := object.get(object.get(input, "fields", {}), kind, {})

# The stricter variants of rules apply in production. Which environments are production is the
# service configuration's `environments` (the one definition), given as input.production.
is_prod if input.production == true

# RFC 6901 escaping of one reference token.
esc(s) := replace(replace(s, "~", "~0"), "/", "~1")

# A pointer token: object keys as they are, array indexes in decimal. (No sprintf: regopy's
# sprintf quotes strings that come from other builtins.)
token(p) := p if {
	is_string(p)
} else := format_int(p, 10)

# JSON pointer into input.fields outside the services: top_ptr("volumes", "data", ["driver_opts"])
# == "/volumes/data/driver_opts". (A place below a service is a finding's "path": the preflight
# makes the pointer, which costs ~0.1 ms a finding here.)

top_ptr(kind, name, path) := concat("/", array.concat(["", kind, esc(name)], [esc(token(p)) | some p in path]))

get(obj, key, fallback) := object.get(obj, key, fallback)

caps(svc, key) := {c |
	some raw in object.get(svc, key, [])
	c := trim_prefix(upper(raw), "CAP_")
}

limits(svc) := object.get(object.get(object.get(svc, "deploy", {}), "resources", {}), "limits", {})
