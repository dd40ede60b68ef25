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
import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
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


@dataclass(frozen=True)
class Blob:
    """A blob the archive will hold: its descriptor and how to read it (checked against the digest on the way)."""

    desc: dict[str, Any]
    open: Callable[[], IO[bytes]]


def _bytes_blob(media_type: str, data: bytes) -> Blob:
    desc = {"mediaType": media_type, "digest": f"sha256:{hashlib.sha256(data).hexdigest()}", "size": len(data)}
    return Blob(desc, lambda: io.BytesIO(data))


def _member(t: tarfile.TarFile, previous: Path, desc: dict[str, Any]) -> IO[bytes]:
    name = blob_name(desc["digest"])
    member = t.getmember(name)
    src = t.extractfile(member)
    if src is None or member.size != desc["size"]:
        raise LayoutError(f"{previous}: {name} is not a file of the {desc['size']} bytes its manifest says")
    return src


def write(out: Path, blobs: list[Blob], index: dict[str, Any]) -> None:
    """The OCI archive OUT: oci-layout, the blobs (each checked against its digest), index.json. Nothing is left at
    OUT when a blob does not match."""
    def add(t: tarfile.TarFile, name: str, size: int, src: IO[bytes]) -> str:
        info = tarfile.TarInfo(name)
        info.size, info.mode = size, 0o644
        h = hashlib.sha256()

        class Hashing(io.RawIOBase):
            def read(self, n: int = -1) -> bytes:
                b = src.read(n)
                h.update(b)
                return b

        t.addfile(info, Hashing())  # type: ignore[arg-type]
        return f"sha256:{h.hexdigest()}"

    try:
        with tarfile.open(out, "w", format=tarfile.PAX_FORMAT, copybufsize=BLOCK) as t:
            layout = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
            add(t, "oci-layout", len(layout), io.BytesIO(layout))
            for blob in blobs:
                with blob.open() as src:
                    got = add(t, blob_name(blob.desc["digest"]), blob.desc["size"], src)
                if got != blob.desc["digest"]:
                    raise LayoutError(f"{blob_name(blob.desc['digest'])}: its content's digest is {got}")
            data = json.dumps(index).encode()
            add(t, "index.json", len(data), io.BytesIO(data))
    except BaseException:
        out.unlink(missing_ok=True)
        raise


def archive(layout: Path, ref: str, out: Path, previous: Path | None) -> tuple[int, int]:
    """LAYOUT's image REF as the OCI archive OUT: each layer buildah skipped (an empty placeholder) from PREVIOUS,
    each other one as buildah compressed it. Returns (layers reused, layers new)."""
    image = read_image(lambda name: (layout / name).read_bytes(), ref)
    with open_archive(previous) as (old, old_image):
        old_layers = old_image.layers_by_diff_id() if old_image else {}
        blobs: list[Blob] = []
        reused = 0
        for diff_id, desc in image.layers_by_diff_id().items():
            if desc["mediaType"] == ZSTD_LAYER:
                blobs.append(Blob(desc, lambda d=desc: (layout / blob_name(d["digest"])).open("rb")))
            elif desc["digest"] == diff_id and diff_id in old_layers and old is not None and previous is not None:
                kept = old_layers[diff_id]
                blobs.append(Blob(kept, lambda t=old, p=previous, d=kept: _member(t, p, d)))
                reused += 1
            else:
                raise LayoutError(f"layer {diff_id}: neither compressed by buildah ({desc['mediaType']}) nor in the "
                                  f"previous archive {previous}")
        config = (layout / blob_name(image.manifest["config"]["digest"])).read_bytes()
        config_blob = _bytes_blob(image.manifest["config"]["mediaType"], config)
        manifest = {**image.manifest, "layers": [b.desc for b in blobs]}
        manifest_blob = _bytes_blob(image.entry["mediaType"], json.dumps(manifest, separators=(",", ":")).encode())
        entry = {**image.entry, "digest": manifest_blob.desc["digest"], "size": manifest_blob.desc["size"]}
        write(out, [*blobs, config_blob, manifest_blob], {"schemaVersion": 2, "manifests": [entry]})
    return reused, len(blobs) - reused


def unreusable(images: dict[str, tuple[bool, list[str]]]) -> list[str]:
    """Of a store's images (ID -> (named, diff IDs)), those no build can reuse: neither named nor a step on the way to
    a named image (their diff IDs a prefix of its own). buildah --layers finds its cached steps among the store's
    images, named or not, so those steps must stay; the rest (an earlier build's final image, the steps of stages
    that are not the image) may go."""
    named = [chain for is_named, chain in images.values() if is_named]
    return [i for i, (is_named, chain) in images.items()
            if not is_named and not any(other[:len(chain)] == chain for other in named)]


def prune(buildah: list[str]) -> list[str]:
    """Remove the store's unreusable images (their layers go with them unless another image holds them)."""
    def run(*args: str) -> str:
        return subprocess.run([*buildah, *args], check=True, capture_output=True, text=True).stdout

    images = {}
    for img in json.loads(run("images", "--all", "--json") or "[]"):
        config = json.loads(run("inspect", "--type", "image", img["id"]))["OCIv1"]
        images[img["id"]] = (bool(img.get("names")), config["rootfs"]["diff_ids"] or [])
    drop = unreusable(images)
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
