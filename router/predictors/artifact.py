"""Predictor artifacts: a folder with ``metadata.json`` beside the predictor's own files.

The metadata names the predictor kind, the models (and engines) it knows, its feature
settings, the training data (sources, record count, sha256 fingerprint, held-out split)
and the library versions it was built with. ``read_metadata`` refuses, with a message
that says what to do, an artifact of another kind or format, one whose pickled objects
come from another major.minor of their library, or whose feature settings differ from
what the caller expects.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import asdict, dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, Mapping, Sequence

from router.predictors.records import Split

FORMAT = "hetserve-predictor"
FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"


class ArtifactError(ValueError):
    """An artifact that cannot be used here; ``str()`` names the artifact and the fix."""


@dataclass
class Metadata:
    kind: str
    models: list[str]
    feature_settings: dict[str, Any]
    train_settings: dict[str, Any]
    data: dict[str, Any]
    """``sources``, ``records``, ``fingerprint``, ``holdout`` and ``seed`` of the split."""
    libraries: dict[str, str]
    pickled: list[str] = field(default_factory=list)
    """Libraries whose objects are pickled in the artifact (versions must match)."""
    engines: list[str] = field(default_factory=list)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    created: str = ""


def library_versions(names: Sequence[str]) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def write_metadata(folder: str | os.PathLike[str], meta: Metadata) -> None:
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    meta.created = meta.created or datetime.datetime.now(datetime.UTC).isoformat(
        timespec="seconds")
    (path / METADATA_FILE).write_text(json.dumps(asdict(meta), indent=2, sort_keys=True)
                                      + "\n", encoding="utf-8")


def read_metadata(folder: str | os.PathLike[str], kind: str,
                  expected_features: Mapping[str, Any] | None = None) -> Metadata:
    """The artifact's metadata after every check; ArtifactError on any mismatch."""
    path = Path(folder)
    where = f"predictor artifact {str(folder)!r}"
    try:
        raw = json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))
        meta = Metadata(**raw)
    except FileNotFoundError:
        raise ArtifactError(f"{where}: no {METADATA_FILE}; build it with "
                            f"`python -m router.train {kind} --data ... --out {folder}`") from None
    except (json.JSONDecodeError, TypeError) as e:
        raise ArtifactError(f"{where}: unreadable {METADATA_FILE} ({e})") from None
    if meta.format != FORMAT or meta.format_version != FORMAT_VERSION:
        raise ArtifactError(f"{where}: format {meta.format} v{meta.format_version}, this "
                            f"hetserve reads {FORMAT} v{FORMAT_VERSION}; retrain it")
    if meta.kind != kind:
        raise ArtifactError(f"{where}: is a {meta.kind!r} predictor, not {kind!r}; point "
                            f"router.predictors.{kind} at a {kind} artifact")
    here = library_versions(meta.pickled)
    for lib in meta.pickled:
        built = meta.libraries.get(lib, "absent")
        if _major_minor(built) != _major_minor(here[lib]):
            raise ArtifactError(f"{where}: built with {lib} {built}, this environment has "
                                f"{here[lib]}; retrain it here (`python -m router.train "
                                f"{kind} ...`)")
    for key, want in (expected_features or {}).items():
        have = meta.feature_settings.get(key, "<unset>")
        if have != want:
            raise ArtifactError(f"{where}: feature setting {key} = {have!r}, expected "
                                f"{want!r}; retrain with that setting")
    return meta


def split_of(folder: str | os.PathLike[str]) -> tuple[str, Split]:
    """(kind, split) of the problems the artifact was trained on (``records.Split``);
    ArtifactError when its metadata cannot say."""
    path = Path(folder) / METADATA_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return str(raw["kind"]), Split.of(raw["data"])
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ArtifactError(f"predictor artifact {str(folder)!r}: cannot read its train / "
                            f"held-out split from {METADATA_FILE} ({e})") from None


def check_covers(meta: Metadata, folder: str | os.PathLike[str], what: str,
                 known: Sequence[str], needed: Sequence[str]) -> None:
    """ArtifactError when the cluster has ``needed`` names the artifact does not know."""
    missing = sorted(set(needed) - set(known))
    if missing:
        raise ArtifactError(
            f"predictor artifact {str(folder)!r} ({meta.kind}): knows {what} "
            f"{', '.join(sorted(known)) or 'none'}, but the cluster also has "
            f"{', '.join(missing)}; retrain it on data that includes them")
