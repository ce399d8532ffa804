package controlplane.compose.rules.sensitive_mounts

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "sensitive-mounts",
	"title": "Container runtime socket or sensitive host path mounted",
	"severity": "fail",
	"rationale": "The Docker (or containerd/Podman) socket is root on the host: whoever can talk to it can start a privileged container, and a read-only mount does not make the API read-only. Mounting /, /etc, /root, /proc, /sys, /dev, /boot, /var/lib, /run, the system parts of /usr (bin, sbin, lib, src, ...), a home directory or its dot-directories (~/.ssh, ~/.aws, ...) or anything below them exposes host credentials (ssh keys, shadow, kubeconfigs), other services' data and kernel interfaces; read-only still discloses them. Application data elsewhere (~/app_data, /usr/share/appdata/app, /srv/app) is not reported.",
	"remediation": "Do not mount the runtime socket (use a narrowly scoped socket proxy if an API is unavoidable, and give it the socket read-only) and mount only application directories, read-only where possible.",
}

# Host directories that must not be mounted, themselves or anything below them: system and
# kernel interfaces, credentials, other services' state. (/usr and /home are not among them as
# a whole: /usr/share/appdata/... and ~/minecraft_data are application data; their system and
# credential parts are listed here and in credential_dir.)
sensitive_trees := ["/etc", "/root", "/proc", "/sys", "/boot", "/dev", "/var/lib", "/var/run", "/run", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib64", "/usr/libexec", "/usr/src", "/usr/include", "/usr/local/bin", "/usr/local/sbin", "/usr/local/lib", "/lib", "/lib64", "/bin", "/sbin", "/snap", "/var/spool/cron"]

# Host directories that must not be mounted as a whole (their other subdirectories are common
# application data: /var/log/app, /var/www, /srv, /opt/app, /usr/share/appdata, ~/app_data).
sensitive_dirs := {"/", "/var", "/opt", "/srv", "/mnt", "/media", "/var/log", "/usr", "/usr/local", "/usr/share", "/home"}

# Host files below a sensitive tree that are customary and harmless to share (the time zone).
harmless_files := {"/etc/localtime", "/etc/timezone"}

socket_names := {"docker.sock", "containerd.sock", "podman.sock", "crio.sock", "dockershim.sock", "cri-dockerd.sock"}

# A home directory itself (~, /home/<user>) or a dot-directory or dot-file of one (~/.ssh,
# /home/alice/.aws, ~/.docker/config.json): where ssh keys, cloud and registry credentials and
# shell history live. Other paths below a home are application data.
home_dir(path) if path == "~"

home_dir(path) if {
	parts := split(trim_suffix(path, "/"), "/")
	count(parts) == 3
	parts[0] == ""
	parts[1] == "home"
}

credential_dir(path) if startswith(path, "~/.")

credential_dir(path) if {
	parts := split(path, "/")
	count(parts) > 3
	parts[0] == ""
	parts[1] == "home"
	startswith(parts[3], ".")
}

sensitive(path) := "container runtime socket" if {
	parts := split(path, "/")
	parts[count(parts) - 1] in socket_names
} else := "sensitive host path" if {
	path in sensitive_dirs
} else := "home directory" if {
	home_dir(path)
} else := "home directory" if {
	credential_dir(path)
} else := "sensitive host path" if {
	not path in harmless_files
	in_sensitive_tree(path)
}

# One match for all the trees (a tree itself or anything below it) instead of one test per tree.
# The tree names hold no regular-expression metacharacters.
sensitive_tree_regex := concat("", ["^(", concat("|", sensitive_trees), ")(/|$)"])

# A path over lib.max_match is not given to the regex: the same test as prefixes.
in_sensitive_tree(path) := regex.match(sensitive_tree_regex, path) if {
	lib.matchable(path)
} else := strings.any_prefix_match(path, [concat("", [tree, "/"]) | some tree in sensitive_trees])

# Socket proxies (tecnativa/docker-socket-proxy, linuxserver/socket-proxy, wollomatic/socket-proxy)
# are the remediation: with the socket read-only they are the least bad way to give an API.
# (An image name over lib.max_match is not given to the regex: no known proxy.)
socket_proxy(svc) if {
	image := lower(object.get(svc, "image", ""))
	lib.matchable(image)
	regex.match(`(^|/)[a-z0-9._-]*(socket-proxy|dockerproxy)(:|@|$)`, image)
}

# The severity of one mount: read-only lowers it, except for a runtime socket (its API is not
# read-only), which is lowered only for a read-only socket proxy.
grade(kind, svc, read_only) := "warn" if {
	kind == "container runtime socket"
	read_only
	socket_proxy(svc)
} else := "fail" if {
	kind == "container runtime socket"
} else := "warn" if {
	read_only
} else := "fail"

# What the message adds about a read-only mount.
note(kind, svc, read_only) := " (read-only, socket proxy: keep its API allow-list narrow)" if {
	kind == "container runtime socket"
	read_only
	socket_proxy(svc)
} else := " (read-only does not restrict the API)" if {
	kind == "container runtime socket"
	read_only
} else := " (read-only)" if {
	read_only
} else := ""

mounted_read_only(v) := true if {
	v.read_only == true
} else := false

_findings_1 := [[name, ["volumes", i, "source"], concat("", [kind, " ", v.source, " mounted at ", v.target, note(kind, svc, ro)]), grade(kind, svc, ro)] |
	some name
	svc := input.fields.services[name]
	vols := object.get(svc, "volumes", [])
	some i
	v := vols[i]
	v.type == "bind"
	kind := sensitive(object.get(v, "source", ""))
	ro := mounted_read_only(v)
]

# A named volume whose driver binds a host path (driver_opts: {type: none, o: bind, device: /etc}).
_findings_2 := [[name, lib.top_ptr("volumes", src, ["driver_opts", "device"]), concat("", ["volume ", src, " binds ", kind, " ", device, ", mounted at ", v.target, note(kind, svc, ro)]), grade(kind, svc, ro)] |
	some name
	svc := input.fields.services[name]
	some v in object.get(svc, "volumes", [])
	v.type == "volume"
	src := object.get(v, "source", "")
	device := object.get(object.get(object.get(lib.top("volumes"), src, {}), "driver_opts", {}), "device", "")
	device != ""
	kind := sensitive(device)
	ro := mounted_read_only(v)
]

findings := array.concat(_findings_1, _findings_2)
