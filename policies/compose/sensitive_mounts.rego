package controlplane.compose.rules.sensitive_mounts

import rego.v1

import data.controlplane.compose.lib

meta := {
	"id": "sensitive-mounts",
	"title": "Container runtime socket or sensitive host path mounted",
	"severity": "fail",
	"rationale": "The Docker (or containerd/Podman) socket is root on the host: whoever can talk to it can start a privileged container. Mounting /, /etc, /proc, /sys, /dev, /boot, /root or the runtime's state exposes host credentials and kernel interfaces, even read-only.",
	"remediation": "Do not mount the runtime socket (use a narrowly scoped socket proxy if an API is unavoidable) and mount only application directories, read-only where possible.",
}

# Host directories that must not be mounted, themselves or anything below them.
sensitive_trees := {"/proc", "/sys", "/boot", "/root", "/var/lib/docker", "/var/lib/containerd", "/var/lib/kubelet", "/etc/kubernetes", "/etc/docker", "/etc/ssh", "/etc/sudoers.d"}

# Host directories that must not be mounted as a whole (files below them may be fine: /etc/localtime).
sensitive_dirs := {"/", "/etc", "/dev", "/var", "/var/run", "/run", "/usr", "/lib", "/bin", "/sbin", "/home", "/etc/shadow", "/etc/passwd", "/etc/sudoers"}

socket_names := {"docker.sock", "containerd.sock", "podman.sock", "crio.sock", "dockershim.sock", "cri-dockerd.sock"}

sensitive(path) := "container runtime socket" if {
	parts := split(path, "/")
	parts[count(parts) - 1] in socket_names
} else := "sensitive host path" if {
	path in sensitive_dirs
} else := "sensitive host path" if {
	some tree in sensitive_trees
	startswith(concat("", [path, "/"]), concat("", [tree, "/"]))
}

_findings_1 := [{"service": name, "pointer": lib.ptr(name, ["volumes", i, "source"]), "message": concat("", [kind, " ", v.source, " mounted at ", v.target])} |
	some name
	svc := lib.services[name]
	v_all := object.get(svc, "volumes", [])
	some i
	v := v_all[i]
	v.type == "bind"
	kind := sensitive(v.source)
]

# A named volume whose driver binds a host path (driver_opts: {type: none, o: bind, device: /etc}).
_findings_2 := [{"service": name, "pointer": lib.top_ptr("volumes", src, ["driver_opts", "device"]), "message": concat("", ["volume ", src, " binds ", kind, " ", device, ", mounted at ", v.target])} |
	some name
	svc := lib.services[name]
	some v in object.get(svc, "volumes", [])
	v.type == "volume"
	src := object.get(v, "source", "")
	definition := object.get(lib.top("volumes"), src, {})
	device := object.get(object.get(definition, "driver_opts", {}), "device", "")
	kind := sensitive(device)
]

findings := array.concat(_findings_1, _findings_2)
