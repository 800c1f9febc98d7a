"""Images built here, not pulled: a static binary as the one layer of an OCI image (image-spec: image-layout.md,
manifest.md, config.md), written as an OCI archive and imported into a node's containerd with
`ctr -n k8s.io images import` (the namespace the CRI plugin reads). The pods name them with `imagePullPolicy: Never`
and the sandbox image is pinned in containerd's config, so nothing is ever pulled.
"""
from __future__ import annotations

import hashlib
import io
import json
import pathlib
import tarfile

MEDIA = "application/vnd.oci.image."


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def _layer(binary: pathlib.Path, paths: tuple[str, ...]) -> bytes:
    out = io.BytesIO()
    data = binary.read_bytes()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for path in paths:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            layer.addfile(info, io.BytesIO(data))
    return out.getvalue()


def write_archive(name: str, binary: pathlib.Path, archive: pathlib.Path, entrypoint: str = "/app",
                  also: tuple[str, ...] = ()) -> pathlib.Path:
    """An OCI archive of image `name` (registry/repo:tag) holding `binary` at `entrypoint`, run as its entrypoint,
    and at the paths `also` (a multi-call binary: sh, sleep, nvidia-smi)."""
    layer = _layer(binary, (entrypoint, *also))
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": [entrypoint], "Env": ["PATH=/usr/bin:/bin:/"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }).encode()
    with tarfile.open(archive, "w") as tar:
        layer_digest, config_digest = _blob(tar, layer), _blob(tar, config)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MEDIA + "manifest.v1+json",
            "config": {"mediaType": MEDIA + "config.v1+json", "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": MEDIA + "layer.v1.tar", "digest": layer_digest, "size": len(layer)}],
        }).encode()
        manifest_digest = _blob(tar, manifest)
        # ctr names an imported image after io.containerd.image.name, else the ref name (client/import.go).
        index = json.dumps({"schemaVersion": 2, "mediaType": MEDIA + "index.v1+json", "manifests": [{
            "mediaType": MEDIA + "manifest.v1+json", "digest": manifest_digest, "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
        }]}).encode()
        for member, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive
