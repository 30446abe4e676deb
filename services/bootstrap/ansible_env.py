"""Kubespray's own Ansible, in an environment of its own.

Each Kubespray release pins the Ansible it runs with (``requirements.txt``:
``ansible==11.13.0`` for v2.31, ansible-core 2.18) and its first play
refuses any other (``playbooks/ansible_version.yml``). The platform's own
ansible-core is newer and only drives ansible-runner, so Kubespray's
playbooks run with the ``ansible-playbook`` of a virtual environment built
from the checkout's ``requirements.txt`` — once per checkout and
requirements, kept under ``PRIMUS_ANSIBLE_ENVS`` (default
``~/.cache/primus-safe/kubespray-ansible``) — or one the operator names
(``--ansible-venv``). The platform's venv is taken off ``PATH`` for those
runs, so nothing of its Ansible is found by accident.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from libs.kubespray import KubesprayRelease

REQUIREMENTS = "requirements.txt"
MARKER = "primus-kubespray-env.txt"  # the requirements digest it was built from
_CORE_VERSION = re.compile(r"ansible(?:-playbook)? \[core ([0-9][0-9.]*)")


class AnsibleEnvError(Exception):
    """An environment that cannot be built or used; the message says why and the fix."""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


@dataclass(frozen=True)
class AnsibleEnv:
    """A virtual environment holding Kubespray's Ansible."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def playbook(self) -> Path:
        return self.bin / "ansible-playbook"

    @property
    def adhoc(self) -> Path:
        return self.bin / "ansible"

    def envvars(self, path: str | None = None) -> dict[str, str]:
        """The environment for a run: this env's ``bin`` first on PATH, the
        platform's own venv off it (its ansible-core must never be the one
        found), and the env named as the active virtualenv."""
        platform_bin = str(Path(sys.executable).parent)
        rest = [p for p in (path if path is not None else os.environ.get("PATH", "")).split(
            os.pathsep) if p and os.path.abspath(p) != os.path.abspath(platform_bin)]
        return {"PATH": os.pathsep.join([str(self.bin), *rest]),
                "VIRTUAL_ENV": str(self.root),
                "ANSIBLE_HOST_KEY_CHECKING": "False"}

    def core_version(self) -> str | None:
        """The ansible-core this environment runs (``ansible --version``)."""
        try:
            out = subprocess.run([str(self.adhoc), "--version"], capture_output=True, text=True,
                                 timeout=60, env={**os.environ, **self.envvars()})
        except (OSError, subprocess.TimeoutExpired):
            return None
        m = _CORE_VERSION.search(out.stdout)
        return m[1] if m else None

    def check(self, release: KubesprayRelease) -> None:
        """Refuse an environment whose Ansible ``release`` would refuse
        (the same bounds as its ansible_version.yml)."""
        for tool in (self.playbook, self.adhoc):
            if not os.access(tool, os.X_OK):
                raise AnsibleEnvError(
                    f"--ansible-venv {self.root}: no {tool.name} in {self.bin}; give a virtual "
                    f"environment with Kubespray's requirements installed (python -m venv DIR "
                    f"&& DIR/bin/pip install -r KUBESPRAY/{REQUIREMENTS})")
        found = self.core_version()
        low, high = release.ansible_core
        if found is None:
            raise AnsibleEnvError(f"{self.adhoc} --version does not name an ansible-core; "
                                  "is this an Ansible environment?")
        if not (_version(low) <= _version(found) < _version(high)):
            raise AnsibleEnvError(
                f"{release.name} needs ansible-core >= {low} and < {high}; {self.root} has "
                f"{found}: install the checkout's {REQUIREMENTS} there, or leave --ansible-venv "
                "out to have one built")


def default_home() -> Path:
    home = os.environ.get("PRIMUS_ANSIBLE_ENVS")
    if home:
        return Path(home)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "primus-safe" / "kubespray-ansible"


def requirements_digest(checkout: Path) -> str:
    """What an environment for ``checkout`` is built from: its path and its
    requirements, so an edited requirements.txt (a new release checked out)
    gets a fresh one and two checkouts never share one."""
    try:
        text = (checkout / REQUIREMENTS).read_bytes()
    except OSError:
        raise AnsibleEnvError(f"--kubespray {checkout}: no {REQUIREMENTS} there; give the root "
                              "of a Kubespray checkout") from None
    return hashlib.sha256(str(checkout.resolve()).encode() + b"\0" + text).hexdigest()


def env_for(checkout: Path, *, home: Path | None = None,
            on_line: Callable[[str], None] = lambda _: None) -> AnsibleEnv:
    """The environment for ``checkout``: the one built before when its
    requirements have not changed, else a fresh one (``python -m venv`` and
    ``pip install -r requirements.txt``, its output passed to ``on_line``)."""
    digest = requirements_digest(checkout)
    root = (home or default_home()) / f"kubespray-{digest[:16]}"
    env = AnsibleEnv(root)
    try:
        if (root / MARKER).read_text().strip() == digest:  # written only once complete
            return env
    except OSError:
        pass
    shutil.rmtree(root, ignore_errors=True)  # half-built or for other requirements
    root.parent.mkdir(parents=True, exist_ok=True)
    on_line(f"building Kubespray's Ansible environment in {root}")
    _step([sys.executable, "-m", "venv", str(root)], on_line, "python -m venv")
    _step([str(root / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
           "-r", str((checkout / REQUIREMENTS).resolve())], on_line,
          f"pip install -r {checkout / REQUIREMENTS}")
    (root / MARKER).write_text(digest + "\n")  # last: only a complete env is reused
    return env


def _step(command: list[str], on_line: Callable[[str], None], what: str) -> None:
    tail: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            if line:
                on_line(line)
                tail = [*tail[-9:], line]
    if proc.returncode != 0:
        raise AnsibleEnvError(f"{what} failed (exit {proc.returncode}):\n  "
                              + "\n  ".join(tail))
