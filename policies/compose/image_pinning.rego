package controlplane.compose.rules.image_pinning

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "image-pinning",
	"title": "Image not pinned",
	"severity": "fail",
	"rationale": "An image without a tag, or tagged :latest, changes under you on every pull; a tag can be moved to a different image at any time. Production deploys must be reproducible and reviewable, which only a digest guarantees.",
	"remediation": "Use an explicit version tag everywhere, and pin by digest in production: image: name:1.2.3@sha256:<digest>.",
}

has_digest(image) if contains(image, "@sha256:")

# The tag is after the last ":" of the last path segment (a registry host may carry a port).
tag(image) := t if {
	name := split(image, "@")[0]
	segments := split(name, "/")
	last := segments[count(segments) - 1]
	contains(last, ":")
	parts := split(last, ":")
	t := parts[count(parts) - 1]
}

problem(image) := "has no tag (implies :latest)" if {
	not has_digest(image)
	not tag(image)
} else := "uses the mutable :latest tag" if {
	not has_digest(image)
	tag(image) == "latest"
}

# An untagged or :latest image fails in production and warns elsewhere.
unpinned_severity := "fail" if {
	lib.is_prod
} else := "warn"

# Nothing to pin: the service is built locally (build:, its image: is only the tag of the
# build's output), or it runs an image another service of the file builds (input.built_images,
# the images of every service with build:, given by the preflight across evaluation chunks).
local(svc) if object.get(svc, "image", "") == ""

local(svc) if object.get(svc, "build", null) != null

local(svc) if object.get(object.get(input, "built_images", {}), svc.image, false) == true

_not_applicable_1 := [name |
	some name
	svc := input.fields.services[name]
	local(svc)
]

# [name, image, problem or ""] of every service with an image to pin, worked out once.
_pinnable := [[name, svc.image, reason] |
	some name
	svc := input.fields.services[name]
	not local(svc)
	reason := reason_or_none(svc.image)
]

reason_or_none(image) := reason if {
	reason := problem(image)
} else := ""

_findings_1 := [[s[0], ["image"], concat(" ", ["image", s[1], s[2]]), unpinned_severity] |
	some s in _pinnable
	s[2] != ""
]

# A tag without a digest in production: warn (--strict fails). 119 of the corpus's 176
# image-pinning findings in prod were a version tag without a digest: digest pinning is a
# deploy pipeline's practice (a bot bumps it) more than a hand-written file's.
_findings_2 := [[s[0], ["image"], concat("", ["image ", s[1], " is not pinned by digest (in ", input.env, " a tag can be moved to another image)"]), "warn"] |
	lib.is_prod
	some s in _pinnable
	s[2] == ""
	not has_digest(s[1])
]

findings := array.concat(_findings_1, _findings_2)

not_applicable := _not_applicable_1
