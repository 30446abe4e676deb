"""Which Kubespray release a checkout holds, read from the checkout itself.

The release decides how the inventory is written and which Kubernetes
versions can be built (``libs.kubespray``). It comes from ``galaxy.yml``
(every release carries ``version: 2.31.0``), else from the git tag checked
out. The checkout's own ``checksums.yml`` and ``ansible_version.yml`` then
replace the pinned figures, so a later patch release (more Kubernetes patch
versions) is read as it is, not as the table remembers its series.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import yaml

from libs.kubespray import KubesprayRelease, UnsupportedRelease, release_for

CHECKSUMS = "roles/kubespray_defaults/vars/main/checksums.yml"
ANSIBLE_VERSION = "playbooks/ansible_version.yml"
_VERSION_LINE = re.compile(r"^version:\s*['\"]?v?([0-9][0-9.]*)['\"]?\s*$", re.MULTILINE)
_ANSIBLE_BOUND = re.compile(r"^\s*(minimal|maximal)_ansible_version:\s*['\"]?([0-9.]+)",
                            re.MULTILINE)


def release_text(checkout: Path) -> str | None:
    """The release the checkout says it is: galaxy.yml's version, else an
    exact release tag at HEAD; None when neither says."""
    try:
        m = _VERSION_LINE.search((checkout / "galaxy.yml").read_text())
    except OSError:
        m = None
    if m:
        return m[1]
    try:
        out = subprocess.run(["git", "-C", str(checkout), "describe", "--tags", "--exact-match"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    tag = out.stdout.strip()
    return tag if out.returncode == 0 and tag else None


def read_release(checkout: Path) -> KubesprayRelease:
    """The rules of the Kubespray release in ``checkout``; raises
    UnsupportedRelease (with the supported list) when it is not one the
    renderer supports or cannot be told."""
    if not checkout.is_dir():
        raise UnsupportedRelease(f"--kubespray {checkout}: no such directory; give the root "
                                 "of a Kubespray checkout")
    text = release_text(checkout)
    if text is None:
        raise UnsupportedRelease(
            f"--kubespray {checkout}: cannot tell which Kubespray release this is (no version "
            "in galaxy.yml, no release tag checked out); check out a release, e.g. "
            "git checkout v2.31.0")
    release = release_for(text)
    versions = _kube_versions(checkout / CHECKSUMS)
    release = release.with_kube_versions(versions, release.version or text.lstrip("v"))
    bounds = _ansible_bounds(checkout / ANSIBLE_VERSION)
    return replace(release, ansible_core=bounds) if bounds else release


def _kube_versions(path: Path) -> list[str]:
    """kubelet's amd64 versions in the checkout's checksums.yml (its list of
    buildable Kubernetes versions); empty when it cannot be read."""
    try:
        doc = yaml.safe_load(path.read_text())
        found = doc["kubelet_checksums"]["amd64"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return []
    return [str(v) for v in found] if isinstance(found, dict) else []


def _ansible_bounds(path: Path) -> tuple[str, str] | None:
    try:
        found = dict(m.groups() for m in _ANSIBLE_BOUND.finditer(path.read_text()))
    except OSError:
        return None
    if "minimal" in found and "maximal" in found:
        return found["minimal"], found["maximal"]
    return None
