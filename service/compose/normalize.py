"""The Compose normalizer: real compose files in, the preflight's normalized ``fields`` out.

Normalized means what ``docker compose config`` prints, minus anything machine-specific:
anchors and merge keys resolved, ``x-`` extensions dropped, variables interpolated, several files
and ``extends`` merged by Compose's merge rules, long syntax for ports, volumes, devices, secrets,
configs and ``env_file``, maps for environment, labels and sysctls, typed scalars.

Decisions worth knowing (also in examples/compose/README.md):
- relative bind sources stay relative (the report must not depend on where a file was checked
  out); absolute ones are normalised with ``posixpath.normpath`` so ``/etc/`` and ``/etc`` agree;
- ``env_file`` stays a list of references; the files are not read into ``environment`` (the
  server cannot read them, and their secret values must not travel in a preflight body);
- ``mem_limit``, ``cpus``, ``mem_reservation``, ``pids_limit`` fold into ``deploy.resources``;
- a typed scalar (bool, int, number) that interpolates to ``""`` is treated as unset;
- ``environment: [NAME]`` without a value takes NAME from the shell/.env, as Compose does
  (so a secret passed through that way is visible to the secret-env rule), else stays null;
- a short port range (``8000-8002:8000-8002``) stays one entry, ``{"target": 8000,
  "target_end": 8002, "published": "8000-8002"}``, where Compose expands it to one entry per
  port: ``1-65535:1-65535`` is one entry and one finding, not 65,535 (issue 17).
"""

from __future__ import annotations

import datetime
import posixpath
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .source import (
    Interpolator,
    NormalizeError,
    Override,
    Reset,
    load_yaml,
    read_dotenv,
    read_source,
)

__all__ = ["NormalizeError", "dotenv_path", "normalize_files", "normalize_text", "project_variables"]

#: Keys whose values are user data, not Compose structure: never strip ``x-`` inside.
_FREEFORM = frozenset({"environment", "labels", "annotations", "driver_opts", "options", "args",
                       "sysctls", "extra_hosts", "storage_opt"})
#: Maps of name -> definition: their keys are names, their values structure.
_NAME_MAPS = frozenset({"services", "networks", "volumes", "secrets", "configs", "models",
                        "depends_on"})


# --- entry points ----------------------------------------------------------------------------

def project_variables(
    files: Sequence[Path],
    *,
    environ: Mapping[str, str] | None = None,
    env_file: Path | None = None,
) -> dict[str, str]:
    """The interpolation variables: the ``.env`` file (beside the first file, or ``env_file``),
    overridden by ``environ`` (the shell wins, as in Compose)."""
    environ = dict(environ or {})
    path = env_file if env_file is not None else (files[0].parent / ".env" if files else None)
    variables: dict[str, str] = {}
    if path is not None and (env_file is not None or path.is_file()):
        variables = read_dotenv(path, environ)
    variables.update(environ)
    return variables


def dotenv_path(files: Sequence[Path], env_file: Path | None = None) -> Path | None:
    """The ``.env`` file the variables come from: ``env_file``, else ``.env`` beside the first
    file when there is one."""
    if env_file is not None:
        return env_file
    path = files[0].parent / ".env" if files else None
    return path if path is not None and path.is_file() else None


def normalize_files(
    files: Sequence[Path],
    *,
    environ: Mapping[str, str] | None = None,
    env_file: Path | None = None,
) -> dict[str, Any]:
    """Load, interpolate and merge compose ``files`` (in ``-f`` order) into normalized fields."""
    if not files:
        raise NormalizeError("no compose file given")
    variables = project_variables(files, environ=environ, env_file=env_file)
    loader = _Loader(variables)
    merged: dict[str, Any] = {}
    for path in files:
        merged = _merge_models(merged, loader.model(Path(path)))
    return _finish(merged)


def normalize_text(
    text: str,
    *,
    variables: Mapping[str, str] | None = None,
    name: str = "<compose>",
    base_dir: Path | None = None,
) -> dict[str, Any]:
    """Normalize one compose document given as text (``extends: file:`` is relative to
    ``base_dir``)."""
    loader = _Loader(dict(variables or {}))
    return _finish(loader.model_from_text(text, name, base_dir or Path.cwd()))


class _Loader:
    """Reads files once per run (``extends`` and ``include`` may reference the same file twice)."""

    def __init__(self, variables: Mapping[str, str]):
        self.interpolator = Interpolator(variables)
        self._cache: dict[Path, dict[str, Any]] = {}
        self._stack: list[Path] = []

    def model(self, path: Path) -> dict[str, Any]:
        path = path.resolve()
        if path in self._cache:
            return self._cache[path]
        if path in self._stack:
            raise NormalizeError(f"{path}: include/extends cycle")
        text = read_source(path)
        self._stack.append(path)
        try:
            model = self.model_from_text(text, str(path), path.parent)
        finally:
            self._stack.pop()
        self._cache[path] = model
        return model

    def model_from_text(self, text: str, name: str, base_dir: Path) -> dict[str, Any]:
        raw = load_yaml(text, name)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise NormalizeError(f"{name}: a compose file must be a mapping at the top level")
        raw = _drop_extensions(raw, top=True)
        written = raw
        # Interpolation runs after YAML (anchors are already expanded) and before typing.
        try:
            raw = self.interpolator.walk(raw, "")
        except NormalizeError as exc:  # its message names the value's path: add the file
            raise NormalizeError(f"{name}: {exc}") from None
        model = _normalize_model(raw, name)
        _environment_as_written(model, written, name)
        if model.get("services"):
            model["services"] = {svc: self._extended(model, svc, base_dir, name, [])
                                 for svc in model["services"]}
        for entry in raw.get("include") or []:
            model = _merge_models(self._included(entry, base_dir, name), model)
        model.pop("include", None)
        return model

    def _extended(
        self, model: dict[str, Any], svc_name: str, base_dir: Path, name: str, seen: list[str]
    ) -> dict[str, Any]:
        service = dict(model["services"][svc_name])
        extends = service.pop("extends", None)
        if extends is None:
            return service
        if isinstance(extends, str):
            extends = {"service": extends}
        if not isinstance(extends, dict) or not isinstance(extends.get("service"), str):
            raise NormalizeError(f"{name}: services.{svc_name}.extends needs a service name")
        key = f"{extends.get('file', '')}#{extends['service']}"
        if key in seen:
            raise NormalizeError(f"{name}: services.{svc_name}: extends cycle")
        if extends.get("file"):
            other = self.model(base_dir / str(extends["file"]))
            if extends["service"] not in (other.get("services") or {}):
                raise NormalizeError(f"{name}: extends: no service {extends['service']!r} in "
                                     f"{extends['file']}")
            base = dict(other["services"][extends["service"]])
            base.pop("extends", None)  # already resolved when that file was loaded
        else:
            if extends["service"] not in (model.get("services") or {}):
                raise NormalizeError(f"{name}: services.{svc_name}.extends: no service "
                                     f"{extends['service']!r}")
            base = self._extended(model, extends["service"], base_dir, name, [*seen, key])
        return _merge_service(base, service)

    def _included(self, entry: Any, base_dir: Path, name: str) -> dict[str, Any]:
        paths = entry.get("path") if isinstance(entry, dict) else entry
        if isinstance(paths, str):
            paths = [paths]
        if not isinstance(paths, list) or not paths:
            raise NormalizeError(f"{name}: include entry needs a path")
        merged: dict[str, Any] = {}
        for item in paths:
            merged = _merge_models(merged, self.model(base_dir / str(item)))
        return merged


#: A variable reference in a value as written (``$$`` is an escaped ``$``, removed first).
_REFERENCE = re.compile(r"\$(\{|[A-Za-z_])")


def _environment_as_written(model: dict[str, Any], written: Any, name: str) -> None:
    """Environment values that reference variables keep the file's text (``${DB_PASSWORD}``),
    and a bare name (``environment: [NAME]``) stays without a value: the fields say what the
    file says, not what this machine's shell or ``.env`` holds (the secret-env rule judges the
    file's own text; a literal in the ``.env`` beside the file is its own finding, from the
    CLI's ``input.dotenv``). The references are still interpolated, so a missing required
    variable is refused as before."""
    services = written.get("services") if isinstance(written, dict) else None
    if not isinstance(services, dict):
        return
    for svc_name, svc in (model.get("services") or {}).items():
        env = svc.get("environment")
        source = services.get(svc_name)
        if not isinstance(env, dict) or not isinstance(source, dict):
            continue
        try:
            texts = _mapping(source.get("environment"), name)
        except NormalizeError:
            continue
        for key, text in texts.items():
            if key in env and isinstance(text, str) and _REFERENCE.search(text.replace("$$", "")):
                env[key] = text


def _drop_extensions(value: Any, *, top: bool = False, names: bool = False) -> Any:
    """Remove ``x-*`` keys from Compose structure, not from user data (labels, environment)
    nor from name maps (a service may be called ``x-ray``)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not names and isinstance(key, str) and key.startswith("x-"):
                if top and key == WAIVERS:  # the one extension the preflight reads
                    out[key] = item
                continue
            if names:
                out[key] = _drop_extensions(item)
            elif key in _FREEFORM:
                out[key] = item
            else:
                out[key] = _drop_extensions(item, names=key in _NAME_MAPS)
        return out
    if isinstance(value, list):
        return [_drop_extensions(item) for item in value]
    return value


# --- typed scalars ---------------------------------------------------------------------------

_TRUE = {"true", "yes", "y", "on", "1"}
_FALSE = {"false", "no", "n", "off", "0"}


def _bool(value: Any, where: str) -> bool | None:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered == "":
            return None
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise NormalizeError(f"{where}: expected a boolean, got {value!r}")


def _int(value: Any, where: str) -> int | None:
    if value is None or isinstance(value, bool):
        return None if value is None else int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text == "":
            return None
        try:
            return int(text, 0) if not re.fullmatch(r"0[0-7]+", text) else int(text, 8)
        except ValueError:
            pass
    raise NormalizeError(f"{where}: expected an integer, got {value!r}")


def _number(value: Any, where: str) -> float | int | None:
    if value is None or isinstance(value, bool):
        return None if value is None else int(value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text == "":
            return None
        try:
            number = float(text)
        except ValueError:
            pass
        else:
            return int(number) if number.is_integer() and "." not in text else number
    raise NormalizeError(f"{where}: expected a number, got {value!r}")


def _str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(value)
    return str(value)


_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


def _bytes(value: Any, where: str) -> int | None:
    """Docker's RAMInBytes: ``512m``, ``1G``, ``1.5gb``, ``2GiB`` (binary multiples)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    text = str(value).strip()
    if text == "":
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?) ?([kKmMgGtTpP])?[iI]?[bB]?", text)
    if match is None:
        raise NormalizeError(f"{where}: invalid size {value!r}")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


def _list_of_str(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, int, float)):
        return [str(value)]
    if isinstance(value, list):
        return [s for s in (_str(v) for v in value) if s is not None]
    raise NormalizeError(f"{where}: expected a string or a list of strings")


def _command(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError:  # unbalanced quotes: Compose would reject it; keep the text whole
            return [value]
    if isinstance(value, list):
        return [str(_str(v)) for v in value if v is not None]
    raise NormalizeError(f"{where}: expected a string or a list")


def _mapping(
    value: Any, where: str, *, split: str = "=", allow_null: bool = True
) -> dict[str, Any]:
    """list ``["K=V", "K"]`` or map -> ``{K: "V", K: None}`` (values as strings)."""
    if value is None:
        return {}
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        for key, item in value.items():
            text = _str(item)
            out[str(key)] = text if (text is not None or allow_null) else ""
        return out
    if isinstance(value, list):
        for item in value:
            text = str(_str(item))
            if split in text:
                key, _, val = text.partition(split)
                out[key] = val
            else:
                out[text] = None if allow_null else ""
        return out
    raise NormalizeError(f"{where}: expected a list or a mapping")


# --- ports -----------------------------------------------------------------------------------

_PORT_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _port_range(text: str, where: str) -> tuple[int, int]:
    match = _PORT_RANGE.match(text.strip())
    if match is None:
        raise NormalizeError(f"{where}: invalid port {text!r}")
    start = int(match.group(1))
    end = int(match.group(2) or start)
    if end < start:
        raise NormalizeError(f"{where}: invalid port range {text!r}")
    return start, end


def _ports(value: Any, where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for index, item in enumerate(_as_list(value, where)):
        at = f"{where}/{index}"
        if isinstance(item, dict):
            out.append(_long_port(item, at))
        elif isinstance(item, (int, str)) and not isinstance(item, bool):
            out.extend(_short_port(str(item), at))
        else:
            raise NormalizeError(f"{at}: invalid port entry")
    return out


def _long_port(item: dict[str, Any], where: str) -> dict[str, Any]:
    port: dict[str, Any] = {}
    if "name" in item and item["name"] is not None:
        port["name"] = str(item["name"])
    target = _int(item.get("target"), f"{where}/target")
    if target is None:
        raise NormalizeError(f"{where}: a port needs a target")
    port["target"] = target
    published = _str(item.get("published"))
    if published not in (None, ""):
        _port_range(published, f"{where}/published")
        port["published"] = published.strip()
    host_ip = _str(item.get("host_ip"))
    if host_ip:
        port["host_ip"] = host_ip
    port["protocol"] = (_str(item.get("protocol")) or "tcp").lower()
    if item.get("app_protocol") is not None:
        port["app_protocol"] = str(item["app_protocol"])
    port["mode"] = _str(item.get("mode")) or "ingress"
    return port


def _short_port(spec: str, where: str) -> list[dict[str, Any]]:
    """``[[HOST_IP:]PUBLISHED:]TARGET[/PROTOCOL]``; a target range is one entry whose
    ``target_end`` is the last port (never one entry per port)."""
    text, _, protocol = spec.strip().partition("/")
    parts = text.rsplit(":", 2)
    host_ip, published = "", ""
    if len(parts) == 3:
        host_ip, published, target = parts
    elif len(parts) == 2:
        published, target = parts
    else:
        target = parts[0]
    host_ip = host_ip.strip("[]")
    t_start, t_end = _port_range(target, where)
    base: dict[str, Any] = {}
    if host_ip:
        base["host_ip"] = host_ip
    base["protocol"] = (protocol or "tcp").lower()
    base["mode"] = "ingress"
    _check_port(t_end, where)
    entry: dict[str, Any] = {"target": t_start}
    if t_end != t_start:
        entry["target_end"] = t_end
    if not published:
        return [{**entry, **base}]
    p_start, p_end = _port_range(published, where)
    _check_port(p_end, where)
    count = t_end - t_start + 1
    pub = str(p_start) if p_start == p_end else f"{p_start}-{p_end}"
    if count != 1 and p_end - p_start + 1 != count:
        raise NormalizeError(f"{where}: port ranges {spec!r} differ in length")
    return [{**entry, "published": pub, **base}]


def _check_port(port: int, where: str) -> None:
    if port > 65535:
        raise NormalizeError(f"{where}: port {port} is over 65535")


# --- volumes ---------------------------------------------------------------------------------

_PROPAGATION = {"shared", "slave", "private", "rshared", "rslave", "rprivate"}
_CONSISTENCY = {"consistent", "cached", "delegated"}
_WINDOWS = re.compile(r"^[A-Za-z]:[\\/]")


def _clean_source(source: str) -> str:
    if source.startswith("/"):
        cleaned = posixpath.normpath(source)
        return "/" + cleaned.lstrip("/")  # normpath keeps a leading "//"
    return source


def _volumes(value: Any, where: str) -> list[dict[str, Any]]:
    out = []
    for index, item in enumerate(_as_list(value, where)):
        at = f"{where}/{index}"
        if isinstance(item, dict):
            out.append(_long_volume(item, at))
        elif isinstance(item, str):
            out.append(_short_volume(item, at))
        else:
            raise NormalizeError(f"{at}: invalid volume entry")
    return out


def _is_path(source: str) -> bool:
    return source.startswith(("/", ".", "~", "\\")) or bool(_WINDOWS.match(source))


def _short_volume(spec: str, where: str) -> dict[str, Any]:
    drive = ""
    text = spec
    if _WINDOWS.match(text):  # C:\data:/data -> keep the drive letter with the source
        drive, text = text[:2], text[2:]
    parts = text.split(":")
    if drive:
        parts[0] = drive + parts[0]
    if len(parts) == 1:
        return {"type": "volume", "target": parts[0]}
    if len(parts) > 3:
        raise NormalizeError(f"{where}: invalid volume {spec!r}")
    source, target = parts[0], parts[1]
    mode = parts[2] if len(parts) == 3 else ""
    if not target:
        raise NormalizeError(f"{where}: invalid volume {spec!r}")
    volume: dict[str, Any] = {}
    options = [o for o in mode.split(",") if o]
    if source and _is_path(source):
        volume["type"] = "bind"
        volume["source"] = _clean_source(source)
        volume["target"] = target
        bind: dict[str, Any] = {"create_host_path": True}
        for option in options:
            if option in _PROPAGATION:
                bind["propagation"] = option
            elif option in ("z", "Z"):
                bind["selinux"] = option
        volume["bind"] = bind
    else:
        volume["type"] = "volume"
        if source:
            volume["source"] = source
        volume["target"] = target
        if "nocopy" in options:
            volume["volume"] = {"nocopy": True}
    if "ro" in options:
        volume["read_only"] = True
    for option in options:
        if option in _CONSISTENCY:
            volume["consistency"] = option
    return volume


def _long_volume(item: dict[str, Any], where: str) -> dict[str, Any]:
    volume = dict(item)
    source = _str(volume.get("source"))
    if not volume.get("type"):
        volume["type"] = "bind" if source and _is_path(source) else "volume"
    volume["type"] = str(volume["type"])
    if source is not None:
        volume["source"] = _clean_source(source) if volume["type"] == "bind" else source
    if volume.get("target") is None:
        raise NormalizeError(f"{where}: a volume needs a target")
    volume["target"] = str(volume["target"])
    if "read_only" in volume:
        flag = _bool(volume["read_only"], f"{where}/read_only")
        if flag is None:
            del volume["read_only"]
        else:
            volume["read_only"] = flag
    for sub, fields in (("bind", ("create_host_path",)), ("volume", ("nocopy",))):
        if isinstance(volume.get(sub), dict):
            block = dict(volume[sub])
            for name in fields:
                if name in block:
                    block[name] = _bool(block[name], f"{where}/{sub}/{name}")
            volume[sub] = block
    if isinstance(volume.get("tmpfs"), dict):
        tmpfs = dict(volume["tmpfs"])
        if "size" in tmpfs:
            tmpfs["size"] = _bytes(tmpfs["size"], where + "/tmpfs/size")  # noqa: S108
        if "mode" in tmpfs:
            tmpfs["mode"] = _int(tmpfs["mode"], where + "/tmpfs/mode")  # noqa: S108
        volume["tmpfs"] = {k: v for k, v in tmpfs.items() if v is not None}
    return volume


def _devices(value: Any, where: str) -> list[dict[str, Any]]:
    out = []
    for index, item in enumerate(_as_list(value, where)):
        at = f"{where}/{index}"
        if isinstance(item, dict):
            source = _str(item.get("source"))
            if not source:
                raise NormalizeError(f"{at}: a device needs a source")
            device = {"source": source, "target": _str(item.get("target")) or source,
                      "permissions": _str(item.get("permissions")) or "rwm"}
        elif isinstance(item, str):
            parts = item.split(":")
            source = parts[0]
            target = parts[1] if len(parts) > 1 and parts[1] else source
            permissions = parts[2] if len(parts) > 2 and parts[2] else "rwm"
            device = {"source": source, "target": target, "permissions": permissions}
        else:
            raise NormalizeError(f"{at}: invalid device entry")
        out.append(device)
    return out


def _file_refs(value: Any, where: str) -> list[dict[str, Any]]:
    """secrets/configs of a service: ``name`` or ``{source, target, uid, gid, mode}``."""
    out = []
    for index, item in enumerate(_as_list(value, where)):
        at = f"{where}/{index}"
        if isinstance(item, str):
            out.append({"source": item})
        elif isinstance(item, dict) and item.get("source") is not None:
            ref: dict[str, Any] = {"source": str(item["source"])}
            for key in ("target", "uid", "gid"):
                if item.get(key) is not None:
                    ref[key] = str(item[key])
            if item.get("mode") is not None:
                ref["mode"] = _int(item["mode"], f"{at}/mode")
            out.append(ref)
        else:
            raise NormalizeError(f"{at}: a secret/config reference needs a source")
    return out


def _env_files(value: Any, where: str) -> list[dict[str, Any]]:
    out = []
    for index, item in enumerate(_as_list(value, where)):
        if isinstance(item, str):
            out.append({"path": item, "required": True})
        elif isinstance(item, dict) and item.get("path"):
            ref: dict[str, object] = {"path": str(item["path"]),
                   "required": _bool(item.get("required", True), f"{where}/{index}/required")}
            if ref["required"] is None:
                ref["required"] = True
            if item.get("format"):
                ref["format"] = str(item["format"])
            out.append(ref)
        else:
            raise NormalizeError(f"{where}/{index}: invalid env_file entry")
    return out


def _as_list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if isinstance(value, (str, int, dict)):
        return [value]
    raise NormalizeError(f"{where}: expected a list")


# --- services --------------------------------------------------------------------------------

_BOOLS = ("privileged", "read_only", "init", "tty", "stdin_open", "oom_kill_disable", "attach",
          "use_api_socket")
_STRINGS = ("image", "user", "network_mode", "pid", "ipc", "uts", "userns_mode", "restart",
            "cgroup", "cgroup_parent", "container_name", "hostname", "domainname", "working_dir",
            "stop_signal", "stop_grace_period", "pull_policy", "platform", "runtime", "isolation",
            "mac_address", "shm_size")
_STRING_LISTS = ("cap_add", "cap_drop", "security_opt", "dns", "dns_search", "dns_opt", "expose",
                 "group_add", "profiles", "external_links", "links", "volumes_from", "tmpfs",
                 "device_cgroup_rules")
_INTS = ("oom_score_adj", "cpu_shares", "cpu_count", "cpu_percent", "scale", "mem_swappiness")


def _service(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise NormalizeError(f"{where}: a service must be a mapping")
    svc: dict[str, Any] = {}
    for key, value in raw.items():
        at = f"{where}/{key}"
        if isinstance(value, (Reset, Override)):
            svc[key] = value  # merge markers are resolved by the merge
            continue
        normalized = _service_field(key, value, at)
        if normalized is not _UNSET:
            svc[key] = normalized
    _fold_resources(svc, where)
    return svc


_UNSET: Any = object()


def _service_field(key: str, value: Any, at: str) -> Any:
    handler = _FIELD_HANDLERS.get(key)
    if handler is not None:
        return handler(value, at)
    if key in _BOOLS:
        flag = _bool(value, at)
        return _UNSET if flag is None else flag
    if key in _STRINGS:
        return _UNSET if value is None else _str(value)
    if key in _STRING_LISTS:
        return _list_of_str(value, at)
    if key in _INTS:
        number = _int(value, at)
        return _UNSET if number is None else number
    return value


def _healthcheck(value: Any, at: str) -> Any:
    if not isinstance(value, dict):
        raise NormalizeError(f"{at}: healthcheck must be a mapping")
    check = dict(value)
    test = check.get("test")
    if isinstance(test, str):
        check["test"] = ["CMD-SHELL", test]
    elif isinstance(test, list):
        check["test"] = [str(_str(t)) for t in test]
    if "retries" in check:
        check["retries"] = _int(check["retries"], f"{at}/retries")
    if "disable" in check:
        check["disable"] = _bool(check["disable"], f"{at}/disable")
    for name in ("interval", "timeout", "start_period", "start_interval"):
        if name in check:
            check[name] = _str(check[name]) or None
    return {k: v for k, v in check.items() if v is not None}


def _deploy(value: Any, at: str) -> Any:
    if value is None:
        return _UNSET  # "deploy: null" is allowed by the Compose schema: no deploy settings
    if not isinstance(value, dict):
        raise NormalizeError(f"{at}: deploy must be a mapping")
    deploy = dict(value)
    if "replicas" in deploy:
        deploy["replicas"] = _int(deploy["replicas"], f"{at}/replicas")
    resources = deploy.get("resources")
    if isinstance(resources, dict):
        resources = dict(resources)
        for section in ("limits", "reservations"):
            block = resources.get(section)
            if isinstance(block, dict):
                resources[section] = _resource_block(block, f"{at}/resources/{section}")
        deploy["resources"] = resources
    if isinstance(deploy.get("labels"), (list, dict)):
        deploy["labels"] = _mapping(deploy["labels"], f"{at}/labels", allow_null=False)
    return {k: v for k, v in deploy.items() if v is not None}


def _resource_block(block: dict[str, Any], at: str) -> dict[str, Any]:
    out = dict(block)
    if "cpus" in out:
        out["cpus"] = _number(out["cpus"], f"{at}/cpus")
    if "memory" in out:
        out["memory"] = _bytes(out["memory"], f"{at}/memory")
    if "pids" in out:
        out["pids"] = _int(out["pids"], f"{at}/pids")
    return {k: v for k, v in out.items() if v is not None}


def _fold_resources(svc: dict[str, Any], where: str) -> None:
    """``mem_limit``/``cpus``/``mem_reservation``/``pids_limit`` are the same settings as
    ``deploy.resources``; fold them so one place holds them (deploy wins when both are set)."""
    moves = (("mem_limit", "limits", "memory", _bytes), ("cpus", "limits", "cpus", _number),
             ("pids_limit", "limits", "pids", _int),
             ("mem_reservation", "reservations", "memory", _bytes))
    for key, section, name, convert in moves:
        if key not in svc or isinstance(svc[key], (Reset, Override)):
            continue
        value = convert(svc.pop(key), f"{where}/{key}")
        if value is None:
            continue
        deploy = svc.setdefault("deploy", {})
        resources = deploy.setdefault("resources", {})
        block = resources.setdefault(section, {})
        block.setdefault(name, value)


def _depends_on(value: Any, at: str) -> Any:
    if isinstance(value, list):
        return {str(v): {"condition": "service_started", "required": True} for v in value}
    if isinstance(value, dict):
        out = {}
        for name, item in value.items():
            item = dict(item or {})
            item.setdefault("condition", "service_started")
            item["required"] = _bool(item.get("required", True), f"{at}/{name}/required")
            if "restart" in item:
                item["restart"] = _bool(item["restart"], f"{at}/{name}/restart")
            out[str(name)] = {k: v for k, v in item.items() if v is not None}
        return out
    raise NormalizeError(f"{at}: depends_on must be a list or a mapping")


def _networks(value: Any, at: str) -> Any:
    if isinstance(value, list):
        return {str(v): None for v in value}
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    if value is None:
        return _UNSET
    raise NormalizeError(f"{at}: networks must be a list or a mapping")


def _build(value: Any, at: str) -> Any:
    if isinstance(value, str):
        return {"context": value}
    if isinstance(value, dict):
        build = dict(value)
        if "args" in build:
            build["args"] = _mapping(build["args"], f"{at}/args")
        if "labels" in build:
            build["labels"] = _mapping(build["labels"], f"{at}/labels", allow_null=False)
        return build
    raise NormalizeError(f"{at}: build must be a string or a mapping")


def _logging(value: Any, at: str) -> Any:
    if not isinstance(value, dict):
        raise NormalizeError(f"{at}: logging must be a mapping")
    out = dict(value)
    if out.get("options") is not None:
        out["options"] = _mapping(out["options"], f"{at}/options", allow_null=False)
    return {k: v for k, v in out.items() if v is not None}


_FIELD_HANDLERS: dict[str, Callable[[Any, str], Any]] = {
    "command": _command,
    "entrypoint": _command,
    "ports": _ports,
    "volumes": _volumes,
    "devices": _devices,
    "secrets": _file_refs,
    "configs": _file_refs,
    "env_file": _env_files,
    "environment": lambda v, at: _mapping(v, at),
    "labels": lambda v, at: _mapping(v, at, allow_null=False),
    "annotations": lambda v, at: _mapping(v, at, allow_null=False),
    "sysctls": lambda v, at: _mapping(v, at, allow_null=False),
    "healthcheck": _healthcheck,
    "deploy": _deploy,
    "depends_on": _depends_on,
    "networks": _networks,
    "build": _build,
    "logging": _logging,
}


# --- the model -------------------------------------------------------------------------------

def _normalize_model(raw: dict[str, Any], name: str) -> dict[str, Any]:
    model: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "version":
            continue  # obsolete; Compose ignores it
        if key == "services":
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise NormalizeError(f"{name}: services must be a mapping")
            model["services"] = {str(s): _service(v, f"/services/{s}") for s, v in value.items()}
        elif key in ("networks", "volumes", "secrets", "configs"):
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise NormalizeError(f"{name}: {key} must be a mapping")
            model[key] = {str(k): _definition(v, f"/{key}/{k}") for k, v in value.items()}
        elif key == "name":
            model["name"] = _str(value)
        elif key == WAIVERS:
            model[key] = _waivers(value, f"{name}: /{WAIVERS}")
        else:
            model[key] = value
    return model


#: The file's waivers: ``[{rule, service, reason, expires}]`` (service.compose.preflight).
WAIVERS = "x-controlplane-waivers"
_WAIVER_KEYS = ("rule", "service", "reason", "expires")


def _waivers(value: Any, where: str) -> list[dict[str, str]]:
    """``x-controlplane-waivers`` as a list of ``{rule, service[, reason][, expires]}`` strings
    (a YAML date or timestamp in ``expires`` becomes its ISO text); whether a waiver is valid
    (a reason, not expired, a rule that may be waived) is the preflight's to say."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise NormalizeError(f"{where}: expected a list of {{rule, service, reason, expires}}")
    out = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise NormalizeError(f"{where}/{index}: expected a mapping")
        waiver: dict[str, str] = {}
        for key in _WAIVER_KEYS:
            raw = item.get(key)
            if isinstance(raw, (datetime.date, datetime.datetime)):
                raw = raw.isoformat()
            text = _str(raw)
            if text is not None:
                waiver[key] = text
        for key in ("rule", "service"):
            if not waiver.get(key):
                raise NormalizeError(f"{where}/{index}: a waiver needs {key}")
        out.append(waiver)
    return out


def _definition(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise NormalizeError(f"{where}: must be a mapping")
    out = dict(value)
    for key in ("labels", "driver_opts"):
        if key in out:
            out[key] = _mapping(out[key], f"{where}/{key}", allow_null=False)
    for key in ("external", "internal", "attachable", "enable_ipv4", "enable_ipv6"):
        if key in out and not isinstance(out[key], dict):
            flag = _bool(out[key], f"{where}/{key}")
            if flag is None:
                del out[key]
            else:
                out[key] = flag
    return out


# --- merging (Compose merge rules) -----------------------------------------------------------

#: Service sequences merged as a union, with the key that identifies an entry.
_UNIQUE_BY: dict[str, Callable[[Any], Any]] = {
    "ports": lambda p: (p.get("host_ip"), p.get("target"), p.get("published"), p.get("protocol")),
    "volumes": lambda v: v.get("target"),
    "devices": lambda d: d.get("target"),
    "secrets": lambda s: (s.get("source"), s.get("target")),
    "configs": lambda s: (s.get("source"), s.get("target")),
    "env_file": lambda e: e.get("path"),
}
for _key in _STRING_LISTS:
    _UNIQUE_BY[_key] = lambda s: s


def _merge_service(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Reset):
            out.pop(key, None)
        elif isinstance(value, Override):
            out[key] = _unmark(value.value)
        elif key in _UNIQUE_BY and isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = _union(out[key], value, _UNIQUE_BY[key])
        elif key in ("command", "entrypoint"):
            out[key] = value  # sequences that replace
        else:
            out[key] = _deep_merge(out.get(key), value)
    return out


def _union(base: list[Any], over: list[Any], key: Callable[[Any], Any]) -> list[Any]:
    merged: dict[Any, Any] = {}
    for item in [*base, *over]:
        ident = key(item)
        try:
            hash(ident)
        except TypeError:
            ident = repr(ident)
        merged.pop(ident, None)  # a later entry replaces an earlier one, at the end
        merged[ident] = item
    return list(merged.values())


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(over, Reset):
        return None
    if isinstance(over, Override):
        return _unmark(over.value)
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            if isinstance(value, Reset):
                out.pop(key, None)
            else:
                out[key] = _deep_merge(out.get(key), value)
        return out
    return _unmark(over)


def _merge_models(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if key == WAIVERS and isinstance(value, list):  # every file's waivers, in -f order
            out[key] = [*(out.get(key) or []), *value]
        elif key == "services" and isinstance(value, dict):
            services = dict(out.get("services") or {})
            for name, svc in value.items():
                if isinstance(svc, Reset):
                    services.pop(name, None)
                elif name in services and not isinstance(svc, Override):
                    services[name] = _merge_service(services[name], svc)
                else:
                    services[name] = _unmark(svc.value if isinstance(svc, Override) else svc)
            out["services"] = services
        elif isinstance(value, Reset):
            out.pop(key, None)
        else:
            out[key] = _deep_merge(out.get(key), value)
    return out


def _unmark(value: Any) -> Any:
    """Drop merge markers left where there was nothing to merge with."""
    if isinstance(value, Override):
        return _unmark(value.value)
    if isinstance(value, dict):
        return {k: _unmark(v) for k, v in value.items() if not isinstance(v, Reset)}
    if isinstance(value, list):
        return [_unmark(v) for v in value if not isinstance(v, Reset)]
    return value


def _finish(model: dict[str, Any]) -> dict[str, Any]:
    model = _unmark(model)
    model.setdefault("services", {})
    for svc in model["services"].values():
        svc.pop("extends", None)
    ordered: dict[str, Any] = {k: model[k] for k in ("name", "services", "networks", "volumes",
                                                     "secrets", "configs") if k in model}
    ordered.update({k: v for k, v in model.items() if k not in ordered})
    return ordered
