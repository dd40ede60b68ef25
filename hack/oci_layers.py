"""hack/images.sh's helper: OCI archives whose unchanged layers are not compressed again, and a buildah store that
keeps only what a later build can reuse. Standard library only (it runs on the machine's Python, as root).

    oci_layers.py placeholders PREVIOUS LAYOUT   before `buildah push --compression-format zstd IMG oci:LAYOUT:REF`
    oci_layers.py archive LAYOUT REF OUT [PREVIOUS]   then: LAYOUT's image as the OCI archive OUT
    oci_layers.py prune BUILDAH...               after the builds: the store's images no build can reuse, removed

buildah compresses every layer of an image at each push (its OCI destinations reuse a blob only by the digest the
source names, and a local layer is named by its uncompressed digest, its diff ID). So before the push, LAYOUT gets an
empty file named after the diff ID of each layer the previous archive holds: buildah takes those layers as present
and skips them; it exports and compresses only the new ones. The archive is then assembled from the new blobs and,
byte for byte, the previous archive's blobs for the layers it skipped: same compressed digests, so a containerd that
imported the previous archive finds their content and snapshots and unpacks only the new layers.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REF_NAME = "org.opencontainers.image.ref.name"
ZSTD_LAYER = "application/vnd.oci.image.layer.v1.tar+zstd"
BLOCK = 1 << 20


class LayoutError(Exception):
    """The layout or an archive is not what the helper expects: the archive is not written."""


@dataclass(frozen=True)
class Image:
    """An image of an OCI layout or archive: its index entry, manifest and config, and its blobs by digest."""

    entry: dict[str, Any]
    manifest: dict[str, Any]
    config: dict[str, Any]

    @property
    def diff_ids(self) -> list[str]:
        return self.config["rootfs"]["diff_ids"]

    def layers_by_diff_id(self) -> dict[str, dict[str, Any]]:
        layers = self.manifest["layers"]
        if len(layers) != len(self.diff_ids):
            raise LayoutError(f"{len(layers)} layers but {len(self.diff_ids)} diff IDs")
        return dict(zip(self.diff_ids, layers, strict=True))


def blob_name(digest: str) -> str:
    algorithm, _, hex_digest = digest.partition(":")
    if algorithm != "sha256" or len(hex_digest) != 64:
        raise LayoutError(f"unexpected digest {digest!r}")
    return f"blobs/sha256/{hex_digest}"


def read_image(read: Any, ref: str | None = None) -> Image:
    """The one image (or the one named REF) of a layout or archive, given a function from a name in it to bytes."""
    entries = json.loads(read("index.json"))["manifests"]
    if ref is not None:
        entries = [e for e in entries if e.get("annotations", {}).get(REF_NAME) == ref]
    if len(entries) != 1:
        raise LayoutError(f"{len(entries)} images named {ref!r} in the index, expected one")
    manifest = json.loads(read(blob_name(entries[0]["digest"])))
    return Image(entries[0], manifest, json.loads(read(blob_name(manifest["config"]["digest"]))))


@contextmanager
def open_archive(path: Path | None) -> Iterator[tuple[tarfile.TarFile | None, Image | None]]:
    if path is None or not path.is_file():
        yield None, None
        return
    with tarfile.open(path) as t:
        def read(name: str) -> bytes:
            f = t.extractfile(name)
            if f is None:
                raise LayoutError(f"{path}: no {name}")
            return f.read()

        yield t, read_image(read)


def placeholders(previous: Path, layout: Path) -> int:
    """Empty blobs named after the previous archive's diff IDs in LAYOUT (fresh); how many."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    with open_archive(previous) as (_, image):
        diff_ids = image.diff_ids if image else []
    for diff_id in diff_ids:
        (layout / blob_name(diff_id)).touch()
    return len(diff_ids)


def copy_verified(src: IO[bytes], size: int, digest: str, out: tarfile.TarFile, name: str) -> None:
    """SRC (SIZE bytes) into OUT as NAME, its sha256 checked against DIGEST on the way."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o644
    h = hashlib.sha256()

    class Hashing:
        def read(self, n: int = -1) -> bytes:
            b = src.read(n)
            h.update(b)
            return b

    out.addfile(info, Hashing())  # type: ignore[arg-type]
    if f"sha256:{h.hexdigest()}" != digest:
        raise LayoutError(f"{name}: its content does not match its digest {digest}")


def add_bytes(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    out.addfile(info, _Reader(data))


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        b, self.pos = self.data[self.pos:end], min(end, len(self.data))
        return b


def archive(layout: Path, ref: str, out: Path, previous: Path | None) -> tuple[int, int]:
    """LAYOUT's image REF as the OCI archive OUT: each layer buildah skipped (an empty placeholder) from PREVIOUS,
    each other one as buildah compressed it. Returns (layers reused, layers new)."""
    image = read_image(lambda name: (layout / name).read_bytes(), ref)
    reused = new = 0
    layers: list[tuple[dict[str, Any], str]] = []  # (descriptor, where: "layout" | "previous")
    with open_archive(previous) as (old, old_image):
        old_layers = old_image.layers_by_diff_id() if old_image else {}
        for diff_id, desc in image.layers_by_diff_id().items():
            if desc["mediaType"] == ZSTD_LAYER:
                layers.append((desc, "layout"))
                new += 1
            elif desc["digest"] == diff_id and diff_id in old_layers:
                layers.append((old_layers[diff_id], "previous"))
                reused += 1
            else:
                raise LayoutError(f"layer {diff_id}: neither compressed by buildah ({desc['mediaType']}) nor in "
                                  f"{previous}")
        manifest = {**image.manifest, "layers": [d for d, _ in layers]}
        manifest_bytes = json.dumps(manifest, separators=(",", ":")).encode()
        manifest_digest = f"sha256:{hashlib.sha256(manifest_bytes).hexdigest()}"
        entry = {**image.entry, "digest": manifest_digest, "size": len(manifest_bytes)}
        config_bytes = (layout / blob_name(image.manifest["config"]["digest"])).read_bytes()
        with tarfile.open(out, "w", format=tarfile.PAX_FORMAT, copybufsize=BLOCK) as t:
            add_bytes(t, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            for desc, where in layers:
                name = blob_name(desc["digest"])
                if where == "layout":
                    with (layout / name).open("rb") as f:
                        copy_verified(f, desc["size"], desc["digest"], t, name)
                else:
                    assert old is not None
                    member = old.getmember(name)
                    if member.size != desc["size"]:
                        raise LayoutError(f"{previous}: {name} has {member.size} bytes, its manifest says {desc['size']}")
                    src = old.extractfile(member)
                    assert src is not None
                    copy_verified(src, member.size, desc["digest"], t, name)
            add_bytes(t, blob_name(image.manifest["config"]["digest"]), config_bytes)
            add_bytes(t, blob_name(manifest_digest), manifest_bytes)
            add_bytes(t, "index.json", json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode())
    return reused, new


def prune(buildah: list[str]) -> list[str]:
    """Remove the store's images that no build can reuse: those neither named nor a step on the way to a named image
    (their diff IDs a prefix of its own: buildah --layers finds its cached steps among the store's images, named or
    not). Returns the removed IDs."""
    def run(*args: str) -> str:
        return subprocess.run([*buildah, *args], check=True, capture_output=True, text=True).stdout

    images = json.loads(run("images", "--all", "--json") or "[]")
    chains = {}
    for img in images:
        chains[img["id"]] = json.loads(run("inspect", "--type", "image", img["id"]))["OCIv1"]["rootfs"]["diff_ids"] or []
    named = [chains[i["id"]] for i in images if i.get("names")]
    drop = [i["id"] for i in images if not i.get("names")
            and not any(chain[:len(chains[i["id"]])] == chains[i["id"]] for chain in named)]
    if drop:
        run("rmi", *drop)
    return drop


def main(argv: list[str]) -> None:
    try:
        match argv:
            case ["placeholders", previous, layout]:
                print(placeholders(Path(previous), Path(layout)))
            case ["archive", layout, ref, out, *previous] if len(previous) <= 1:
                reused, new = archive(Path(layout), ref, Path(out), Path(previous[0]) if previous else None)
                print(f"{reused} layers reused, {new} new")
            case ["prune", *buildah] if buildah:
                print(f"{len(prune(buildah))} images removed")
            case _:
                sys.exit(__doc__)
    except LayoutError as e:
        sys.exit(f"oci_layers: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
