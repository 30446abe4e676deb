"""A kubelet for ``FakeKubeApi``: every pod the fake API server holds runs
as a local process, so the platform's Kubernetes path (scheduler driver,
pod watch, failover's node API) can run end to end without a cluster.

What it does, as a kubelet would:
- a new pod starts (its container's command, its env with
  ``secretKeyRef`` values read from the fake API's Secrets; a pod whose
  Secret or key is missing stays Pending, as CreateContainerConfigError);
- volumes are local directories: a claim is ``<root>/claims/<claim>`` (its
  ``subPath`` below it, created when missing), an emptyDir is per pod, a
  hostPath is ``<root>/host/<path>``; a Secret volume gets one file per key.
  Paths in the env, the command and ``workingDir`` that start with a mount
  path are rewritten to the mount's directory (a process here has no mount
  namespace);
- the pod watch hears Running when the process starts and the container's
  termination (exit code; a signal as 128 + its number) when it ends;
- a deleted pod's process gets SIGTERM, then SIGKILL after the grace
  period, and the watch hears DELETED with how it ended.
The image, resources and node are not emulated: every pod runs here.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.drivers.k8s_fake_api import FakeKubeApi


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Run:
    proc: subprocess.Popen[bytes]
    pod: dict[str, Any]
    started: str
    deleted_at: float | None = None


class FakeKubelet:
    def __init__(self, api: FakeKubeApi, root: Path) -> None:
        self.api = api
        self.root = root
        self.runs: dict[str, _Run] = {}
        self.done: set[str] = set()  # pods whose process ended (never started again)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)

    def start(self) -> FakeKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for run in self.runs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()

    # ------------------------------------------------------------------ loop

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self.api._lock:
                pods = {name: pod for name, pod in self.api.pods.items()}
            for name, pod in pods.items():
                if name not in self.runs and name not in self.done:
                    self._start(name, pod)
            for name, run in list(self.runs.items()):
                if name not in pods and run.deleted_at is None:
                    run.deleted_at = time.monotonic()
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(run.proc.pid, signal.SIGTERM)
                grace = run.pod["spec"].get("terminationGracePeriodSeconds", 30)
                if run.deleted_at is not None and run.proc.poll() is None \
                        and time.monotonic() - run.deleted_at > grace:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(run.proc.pid, signal.SIGKILL)
                code = run.proc.poll()
                if code is not None:
                    self._ended(name, run, code)
            self._stop.wait(0.1)

    def _start(self, name: str, pod: dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        env = self._env(container.get("env") or [])
        if env is None:
            return  # a Secret or key it reads is missing: Pending, tried again
        mounts = self._mounts(name, pod)
        env = {k: _rewrite(v, mounts) for k, v in env.items()}
        argv = [_rewrite(a, mounts) for a in container["command"]]
        cwd = _rewrite(container.get("workingDir") or str(self.root), mounts)
        Path(cwd).mkdir(parents=True, exist_ok=True)
        log = (self.root / "logs").joinpath(f"{name}.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, env={"PATH": os.environ["PATH"], **env}, cwd=cwd,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        run = self.runs[name] = _Run(proc, pod, _now())
        self._push("MODIFIED", pod, {"phase": "Running", "containerStatuses": [{
            "name": container["name"], "state": {"running": {"startedAt": run.started}}}]})

    def _ended(self, name: str, run: _Run, code: int) -> None:
        del self.runs[name]
        self.done.add(name)
        exit_code = 128 - code if code < 0 else code  # a signal, as the kubelet reports it
        status = {"phase": "Succeeded" if exit_code == 0 else "Failed", "containerStatuses": [{
            "name": run.pod["spec"]["containers"][0]["name"], "state": {"terminated": {
                "exitCode": exit_code, "startedAt": run.started, "finishedAt": _now()}}}]}
        with self.api._lock:
            if name in self.api.pods:
                self.api.pods[name]["status"] = status
        self._push("DELETED" if run.deleted_at is not None else "MODIFIED", run.pod, status)

    def _push(self, kind: str, pod: dict[str, Any], status: dict[str, Any]) -> None:
        self.api.push(kind, {**pod, "status": status})

    # ------------------------------------------------------------------ pieces

    def _secret(self, name: str) -> dict[str, str] | None:
        with self.api._lock:
            obj = self.api.secrets.get(name)
        if obj is None:
            return None
        values = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        values.update(obj.get("stringData") or {})
        return values

    def _env(self, entries: list[dict[str, Any]]) -> dict[str, str] | None:
        env: dict[str, str] = {}
        for e in entries:
            if "value" in e:
                env[e["name"]] = e["value"]
                continue
            ref = e["valueFrom"]["secretKeyRef"]
            values = self._secret(ref["name"])
            if values is None or ref["key"] not in values:
                return None
            env[e["name"]] = values[ref["key"]]
        return env

    def _mounts(self, pod_name: str, pod: dict[str, Any]) -> list[tuple[str, str]]:
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        out = []
        for m in pod["spec"]["containers"][0].get("volumeMounts") or []:
            v = volumes[m["name"]]
            if "persistentVolumeClaim" in v:
                local = self.root / "claims" / v["persistentVolumeClaim"]["claimName"]
            elif "hostPath" in v:
                local = self.root / "host" / v["hostPath"]["path"].lstrip("/")
            else:
                local = self.root / "pods" / pod_name / m["name"]
            local = local / m.get("subPath", "")
            local.mkdir(parents=True, exist_ok=True)
            if "secret" in v:
                for key, value in (self._secret(v["secret"]["secretName"]) or {}).items():
                    (local / key).write_text(value)
            out.append((m["mountPath"].rstrip("/"), str(local)))
        return sorted(out, key=lambda p: -len(p[0]))  # the deepest mount first


def _rewrite(text: str, mounts: list[tuple[str, str]]) -> str:
    """Every occurrence of a mount path that starts a path in ``text``."""
    for path, local in mounts:
        text = text.replace(path + "/", local + "/")
        if text == path or text.endswith(" " + path) or text.startswith(path + " "):
            text = text.replace(path, local)
    return text
