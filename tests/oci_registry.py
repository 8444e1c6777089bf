"""A REAL OCI registry on 127.0.0.1 for the pipeline tests, and a tiny client that pushes into it.

The registry is Debian's ``docker-registry`` (the CNCF distribution registry, 2.8), installed by
scripts/install-system-deps.sh. Images are pushed through the registry's own HTTP API (blob
upload + manifest PUT) with digests we compute ourselves, so the registry's
``Docker-Content-Digest`` is checked against an independent value.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from raytrain_eks.backends.local_services import ServiceStartError, free_port, start_with_retries  # noqa: F401  (free_port re-exported)

REGISTRY_BINARY = shutil.which("docker-registry") or shutil.which("registry")
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"




def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class LocalRegistry:
    """A running registry and a tiny client that pushes images through its HTTP API."""

    url: str
    """``http://127.0.0.1:<port>``."""
    data_dir: Path
    """Its storage; a second registry (e.g. with token auth) can serve the same images."""

    @property
    def host(self) -> str:
        return self.url.removeprefix("http://")

    def _call(self, method: str, url: str, data: bytes | None = None, headers: dict | None = None):
        request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.headers, reply.read()

    def push_blob(self, name: str, data: bytes) -> str:
        """Monolithic upload: POST starts a session, PUT ?digest= closes it."""
        digest = sha256(data)
        status, headers, _ = self._call("POST", f"{self.url}/v2/{name}/blobs/uploads/", b"")
        assert status == 202, status
        location = headers["Location"]
        if location.startswith("/"):
            location = self.url + location
        separator = "&" if "?" in location else "?"
        status, headers, _ = self._call(
            "PUT", f"{location}{separator}digest={digest}", data,
            {"Content-Type": "application/octet-stream"})
        assert status == 201, status
        assert headers["Docker-Content-Digest"] == digest
        return digest

    def push_manifest(self, name: str, tag: str, manifest: dict, media_type: str) -> str:
        body = json.dumps(manifest, indent=2).encode()
        status, headers, _ = self._call("PUT", f"{self.url}/v2/{name}/manifests/{tag}", body,
                                        {"Content-Type": media_type})
        assert status == 201, status
        digest = sha256(body)
        assert headers["Docker-Content-Digest"] == digest
        return digest

    def push_image(self, name: str, tag: str, *, content: bytes = b"hello\n",
                   media_type: str = DOCKER_MANIFEST) -> str:
        """Push a one-layer image; returns the manifest digest computed here."""
        layer = _tar_gz({"hello.txt": content})
        layer_digest = self.push_blob(name, layer)
        config = json.dumps({
            "architecture": "amd64", "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [sha256(gzip.decompress(layer))]},
            "config": {"Cmd": ["cat", "/hello.txt"]},
        }).encode()
        config_digest = self.push_blob(name, config)
        oci = media_type == OCI_MANIFEST
        manifest = {
            "schemaVersion": 2, "mediaType": media_type,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json" if oci
                       else "application/vnd.docker.container.image.v1+json",
                       "size": len(config), "digest": config_digest},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip" if oci
                        else "application/vnd.docker.image.rootfs.diff.tar.gzip",
                        "size": len(layer), "digest": layer_digest}],
        }
        return self.push_manifest(name, tag, manifest, media_type)

    def push_index(self, name: str, tag: str, arch_digests: dict[str, tuple[str, int]]) -> str:
        """An OCI index (multi-arch tag) over manifests already pushed: {arch: (digest, size)}."""
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": digest, "size": size,
             "platform": {"architecture": arch, "os": "linux"}}
            for arch, (digest, size) in arch_digests.items()]}
        return self.push_manifest(name, tag, index, OCI_INDEX)

    def manifest_size(self, name: str, reference: str, media_type: str) -> int:
        _, headers, _ = self._call("HEAD", f"{self.url}/v2/{name}/manifests/{reference}",
                                   headers={"Accept": media_type})
        return int(headers["Content-Length"])


def _tar_gz(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def start_registry(workdir: Path, extra_config: str = "", data_dir: Path | None = None
                   ) -> tuple[subprocess.Popen, str]:
    """Start docker-registry on a free loopback port (storage ``workdir/data`` unless given);
    wait until it answers. A start that does not answer in time (a loaded machine) is stopped
    and started again on a fresh port with a longer wait (``start_with_retries``)."""
    data_dir = data_dir or workdir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)

    def start(attempt: int) -> tuple[subprocess.Popen, str]:
        port = free_port()
        config = workdir / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {data_dir}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{port}\n" + extra_config)
        log = open(workdir / "registry.log", "wb")
        proc = subprocess.Popen([REGISTRY_BINARY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20 * attempt  # a bound on waiting for the event
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServiceStartError(f"docker-registry exited: {(workdir / 'registry.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{url}/v2/", timeout=1).close()
                return proc, url
            except urllib.error.HTTPError:
                return proc, url  # 401 from a token-auth registry: it is up
            except OSError:
                time.sleep(0.1)
        stop(proc)
        raise ServiceStartError(f"docker-registry did not answer within {20 * attempt} s")

    return start_with_retries(start, "docker-registry")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
