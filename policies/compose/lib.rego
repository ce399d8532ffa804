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

# (A path of references costs a fifth of nested object.get calls in regopy: ~1.6 against ~7 us.)
limits(svc) := l if {
	l := svc.deploy.resources.limits
} else := {}

# The longest string (in characters) any rule gives to a regex builtin (regex.match, ...; no
# rule uses glob). regopy 1.5's regular expressions recurse once per byte that a repetition
# consumes, ~320 bytes of stack each: an 8 MiB stack overflows (SIGSEGV: no error a handler
# could catch) at ~26,000 bytes, for every pattern of these rules with a repetition (measured:
# policies/compose/README.md, "Untrusted strings and regular expressions"). 2,048 characters
# are at most 8 KiB of UTF-8, ~2.6 MB of stack: a third of the default 8 MiB (the server's
# evaluator processes give their evaluating thread 64 MiB). A longer string gets a cheap check
# without a regex, or a finding that says it was too long to inspect: never a silent pass.
max_match := 2048

matchable(s) if count(s) <= max_match

# trim and trim_space fail on a string with a backslash in regopy 1.5 ("Invalid escape
# sequence", an error cell; policies/README.md, Strings). No value the rules compare after
# trimming (options, harmless values, placeholders, hashes) has one, so such a string is
# compared untrimmed. A literal "\\" keeps its escape in regopy 1.5 (two characters), so the one
# backslash is decoded.
backslash := base64.decode("XA==")

trim_space_safe(s) := trim_space(s) if {
	not contains(s, backslash)
} else := s

trim_safe(s, cutset) := trim(s, cutset) if {
	not contains(s, backslash)
} else := s

# The top-level extension that holds the file's waivers (rule waivers.rego; the preflight marks
# the findings they lift).
waivers_key := "x-controlplane-waivers"
