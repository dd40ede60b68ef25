"""hack/oci_layers.py on OCI layouts made here: an archive takes the layers buildah compressed from the layout and,
byte for byte, the ones it skipped (the placeholders named after the previous archive's diff IDs) from the previous
archive; a blob whose content does not match its digest, or a skipped layer the previous archive lacks, writes no
archive; and a store keeps exactly the images a later build can reuse. The real builds:
tests/house/test_image_archives.py.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import oci_layers  # hack/oci_layers.py
import pytest

REF = "ghcr.io/eyrie-dev/eyrie-operator:0.1.0"
TAR = "application/vnd.oci.image.layer.v1.tar"


def sha(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def put(layout: Path, data: bytes) -> str:
    d = sha(data)
    (layout / oci_layers.blob_name(d)).parent.mkdir(parents=True, exist_ok=True)
    (layout / oci_layers.blob_name(d)).write_bytes(data)
    return d


def layout_with(layout: Path, layers: list[tuple[str, bytes | None]], ref: str = REF) -> None:
    """A layout as `buildah push ... oci:LAYOUT:REF` leaves it: per layer (diff ID, its zstd blob), or (diff ID,
    None) for a layer buildah skipped because a blob of that name (a placeholder) was there."""
    descs = []
    for diff_id, blob in layers:
        if blob is None:
            descs.append({"mediaType": TAR, "digest": diff_id, "size": 0})
        else:
            descs.append({"mediaType": oci_layers.ZSTD_LAYER, "digest": put(layout, blob), "size": len(blob)})
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": [d for d, _ in layers]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": put(layout, config), "size": len(config)},
                           "layers": descs}).encode()
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": put(layout, manifest),
         "size": len(manifest), "annotations": {oci_layers.REF_NAME: ref}}]}))


def read(archive: Path) -> tuple[dict, dict, dict[str, bytes]]:
    """The archive's index entry, manifest and every blob by digest, each blob checked against its name."""
    with tarfile.open(archive) as t:
        files = {m.name: t.extractfile(m).read() for m in t.getmembers()}  # type: ignore[union-attr]
    blobs = {f"sha256:{n.rsplit('/', 1)[1]}": b for n, b in files.items() if n.startswith("blobs/sha256/")}
    assert all(sha(b) == d for d, b in blobs.items())
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    [entry] = json.loads(files["index.json"])["manifests"]
    return entry, json.loads(blobs[entry["digest"]]), blobs


def test_a_first_archive_holds_every_layer_buildah_compressed(tmp_path):
    layout_with(tmp_path / "l", [("sha256:" + "1" * 64, b"base-zstd"), ("sha256:" + "2" * 64, b"top-zstd")])
    assert oci_layers.archive(tmp_path / "l", REF, tmp_path / "a.tar", tmp_path / "none.tar") == (0, 2)
    entry, manifest, blobs = read(tmp_path / "a.tar")
    assert entry["annotations"][oci_layers.REF_NAME] == REF
    assert [blobs[d["digest"]] for d in manifest["layers"]] == [b"base-zstd", b"top-zstd"]
    assert {d["mediaType"] for d in manifest["layers"]} == {oci_layers.ZSTD_LAYER}
    assert json.loads(blobs[manifest["config"]["digest"]])["rootfs"]["diff_ids"][1] == "sha256:" + "2" * 64


def test_the_layers_buildah_skipped_come_byte_for_byte_from_the_previous_archive(tmp_path):
    base, deps, old_top, new_top = ("sha256:" + c * 64 for c in "1234")
    layout_with(tmp_path / "old", [(base, b"base-zstd"), (deps, b"deps-zstd"), (old_top, b"wheel-1")])
    oci_layers.archive(tmp_path / "old", REF, tmp_path / "old.tar", None)
    _, old_manifest, _ = read(tmp_path / "old.tar")

    # what buildah is given before the next push: an empty blob per diff ID of the previous archive
    assert oci_layers.placeholders(tmp_path / "old.tar", tmp_path / "new") == 3
    assert sorted(p.name for p in (tmp_path / "new/blobs/sha256").iterdir()) == sorted(
        d.partition(":")[2] for d in (base, deps, old_top))
    assert all(p.stat().st_size == 0 for p in (tmp_path / "new/blobs/sha256").iterdir())

    layout_with(tmp_path / "new", [(base, None), (deps, None), (new_top, b"wheel-2")])
    assert oci_layers.archive(tmp_path / "new", REF, tmp_path / "new.tar", tmp_path / "old.tar") == (2, 1)
    _, manifest, blobs = read(tmp_path / "new.tar")
    assert manifest["layers"][:2] == old_manifest["layers"][:2]  # same digests: a node has them already
    assert [blobs[d["digest"]] for d in manifest["layers"]] == [b"base-zstd", b"deps-zstd", b"wheel-2"]
    assert old_manifest["layers"][2]["digest"] not in blobs


def test_a_skipped_layer_the_previous_archive_lacks_writes_no_archive(tmp_path):
    layout_with(tmp_path / "old", [("sha256:" + "1" * 64, b"base-zstd")])
    oci_layers.archive(tmp_path / "old", REF, tmp_path / "old.tar", None)
    layout_with(tmp_path / "new", [("sha256:" + "1" * 64, None), ("sha256:" + "9" * 64, None)])
    with pytest.raises(oci_layers.LayoutError, match=r"sha256:9{64}: neither compressed by buildah"):
        oci_layers.archive(tmp_path / "new", REF, tmp_path / "new.tar", tmp_path / "old.tar")
    assert not (tmp_path / "new.tar").exists()


def test_a_blob_that_does_not_match_its_digest_writes_no_archive(tmp_path):
    layout_with(tmp_path / "l", [("sha256:" + "1" * 64, b"base-zstd"), ("sha256:" + "2" * 64, b"top-zstd")])
    (tmp_path / "l" / oci_layers.blob_name(sha(b"top-zstd"))).write_bytes(b"top-zstX")
    with pytest.raises(oci_layers.LayoutError, match="its content's digest is"):
        oci_layers.archive(tmp_path / "l", REF, tmp_path / "a.tar", None)
    assert not (tmp_path / "a.tar").exists()


def test_a_previous_archive_whose_blob_was_altered_is_caught(tmp_path):
    """The reused bytes are checked too: a corrupted previous archive is not carried forward."""
    layout_with(tmp_path / "old", [("sha256:" + "1" * 64, b"base-zstd")])
    oci_layers.archive(tmp_path / "old", REF, tmp_path / "old.tar", None)
    data = (tmp_path / "old.tar").read_bytes()
    (tmp_path / "old.tar").write_bytes(data.replace(b"base-zstd", b"base-zstX"))
    layout_with(tmp_path / "new", [("sha256:" + "1" * 64, None), ("sha256:" + "2" * 64, b"top")])
    with pytest.raises(oci_layers.LayoutError, match="its content's digest is"):
        oci_layers.archive(tmp_path / "new", REF, tmp_path / "new.tar", tmp_path / "old.tar")
    assert not (tmp_path / "new.tar").exists()


def test_the_store_keeps_the_named_images_and_every_step_towards_them():
    base, deps, wheel1, wheel2, src = ("sha256:" + c * 64 for c in "12345")
    images = {
        "base": (True, [base]),
        "env-step": (False, [base]),  # an ENV or LABEL step: no layer of its own
        "deps-step": (False, [base, deps]),
        "final-now": (True, [base, deps, wheel2]),
        "final-before": (False, [base, deps, wheel1]),  # the previous build's image, its name taken by the new one
        "wheel-stage": (False, [base, src]),  # a stage that is not the image
        "empty": (False, []),
    }
    assert sorted(oci_layers.unreusable(images)) == ["final-before", "wheel-stage"]
    assert oci_layers.unreusable({"a": (False, [base])}) == ["a"]
