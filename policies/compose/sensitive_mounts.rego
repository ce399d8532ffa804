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
	startswith(path, "/home/") # cheap, and false for most paths (the rest implies it)
	parts := split(trim_suffix(path, "/"), "/")
	count(parts) == 3
	parts[0] == ""
	parts[1] == "home"
}

credential_dir(path) if startswith(path, "~/.")

credential_dir(path) if {
	startswith(path, "/home/") # cheap, and false for most paths (the rest implies it)
	parts := split(path, "/")
	count(parts) > 3
	parts[0] == ""
	parts[1] == "home"
	startswith(parts[3], ".")
}

sensitive(path) := "container runtime socket" if {
	endswith(path, ".sock") # every socket name does: cheap, no split for other paths
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

# A tree itself or anything below it: one prefix test for all the trees (no regex: regex.match
# compiles its pattern on every call, ~4x the cost of these two tests; and any length is fine).
sensitive_tree_prefixes := [concat("", [tree, "/"]) | some tree in sensitive_trees]

in_sensitive_tree(path) if path in sensitive_trees

in_sensitive_tree(path) if strings.any_prefix_match(path, sensitive_tree_prefixes)

# Socket proxies (tecnativa/docker-socket-proxy, linuxserver/socket-proxy, wollomatic/socket-proxy)
# are the remediation: with the socket read-only they are the least bad way to give an API.
# (An image name over lib.max_match is not given to the regex: no known proxy.)
socket_proxy(svc) if {
	image := lower(object.get(svc, "image", ""))
	lib.matchable(image)
	regex.match(`(^|/)[a-z0-9._-]*(socket-proxy|dockerproxy)(:|@|$)`, image)
}

# How one mount is graded, worked out once for its severity and its note: read-only lowers the
# severity, except for a runtime socket (its API is not read-only), which is lowered only for a
# read-only socket proxy.
mount_class(kind, svc, read_only) := "read-write" if {
	not read_only
} else := "socket proxy" if {
	kind == "container runtime socket"
	socket_proxy(svc)
} else := "socket" if {
	kind == "container runtime socket"
} else := "read-only"

# Each class's severity, and what the message adds about the mount.
graded := {
	"read-write": {"severity": "fail", "note": ""},
	"socket proxy": {"severity": "warn", "note": " (read-only, socket proxy: keep its API allow-list narrow)"},
	"socket": {"severity": "fail", "note": " (read-only does not restrict the API)"},
	"read-only": {"severity": "warn", "note": " (read-only)"},
}

grade(kind, svc, read_only) := graded[mount_class(kind, svc, read_only)].severity

note(kind, svc, read_only) := graded[mount_class(kind, svc, read_only)].note

_findings_1 := [[name, ["volumes", i, "source"], concat("", [kind, " ", v.source, " mounted at ", v.target, g.note]), g.severity] |
	some name
	svc := input.fields.services[name]
	some i
	v := svc.volumes[i]
	v.type == "bind"
	kind := sensitive(v.source)
	g := graded[mount_class(kind, svc, object.get(v, "read_only", false) == true)]
]

# A named volume whose driver binds a host path (driver_opts: {type: none, o: bind, device: /etc}).
_findings_2 := [[name, lib.top_ptr("volumes", src, ["driver_opts", "device"]), concat("", ["volume ", src, " binds ", kind, " ", device, ", mounted at ", v.target, g.note]), g.severity] |
	some name
	svc := input.fields.services[name]
	some v in svc.volumes
	v.type == "volume"
	src := v.source
	device := input.fields.volumes[src].driver_opts.device
	device != ""
	kind := sensitive(device)
	g := graded[mount_class(kind, svc, object.get(v, "read_only", false) == true)]
]

findings := array.concat(_findings_1, _findings_2)
