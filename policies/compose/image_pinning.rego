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

# What an image needs: "digest" (pinned: nothing), a problem (no tag, or :latest), or "tag" (a
# version tag without a digest: only production asks for more). The tag is worked out once.
image_status(image) := "digest" if {
	has_digest(image)
} else := tag_status(tag_or_null(image))

tag_or_null(image) := t if {
	t := tag(image)
} else := null

tag_status(t) := "has no tag (implies :latest)" if {
	t == null
} else := "uses the mutable :latest tag" if {
	t == "latest"
} else := "tag"

problems := {"has no tag (implies :latest)", "uses the mutable :latest tag"}

problem(image) := status if {
	status := image_status(image)
	status in problems
}

# An untagged or :latest image fails in production and warns elsewhere.
unpinned_severity := "fail" if {
	lib.is_prod
} else := "warn"

# Nothing to pin ("local"): the service is built locally (build:, its image: is only the tag of
# the build's output), or it runs an image another service of the file builds
# (input.built_images, the images of every service with build:, given by the preflight across
# evaluation chunks). Else what its image needs (image_status).
service_status(svc, image) := "local" if {
	image == ""
} else := "local" if {
	svc.build != null
} else := "local" if {
	input.built_images[image] == true
} else := image_status(image)

local(svc) if service_status(svc, object.get(svc, "image", "")) == "local"

# [name, image, service_status] of every service, worked out once for the three lists below.
_status := [[name, image, service_status(svc, image)] |
	some name
	svc := input.fields.services[name]
	image := object.get(svc, "image", "")
]

_not_applicable_1 := [s[0] |
	some s in _status
	s[2] == "local"
]

_findings_1 := [[s[0], ["image"], concat(" ", ["image", s[1], s[2]]), unpinned_severity] |
	some s in _status
	s[2] in problems
]

# A tag without a digest in production: warn (--strict fails). 119 of the corpus's 176
# image-pinning findings in prod were a version tag without a digest: digest pinning is a
# deploy pipeline's practice (a bot bumps it) more than a hand-written file's.
_findings_2 := [[s[0], ["image"], concat("", ["image ", s[1], " is not pinned by digest (in ", input.env, " a tag can be moved to another image)"]), "warn"] |
	lib.is_prod
	some s in _status
	s[2] == "tag"
]

findings := array.concat(_findings_1, _findings_2)

not_applicable := _not_applicable_1
