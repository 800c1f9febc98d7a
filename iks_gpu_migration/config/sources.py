"""Where the program pulls code from: container images (the smoke and rollback-check pods) and Helm charts. What the
stack file names here runs on the cluster, so only references that pin or authenticate their source are accepted:
images by the reference grammar, with `@sha256:` digests recommended; charts from https:// repositories or oci://
registries (optionally by digest), local charts only in the local environment (cross_checks.py)."""
import re
import urllib.parse
from dataclasses import dataclass
from typing import Optional

# github.com/distribution/reference v0.6.0 regexp.go: the grammar containerd and the kubelet parse image names with.
# ASCII only (Go's \w is [0-9A-Za-z_]).
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_NAME = rf"(?:{_HOST}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_REFERENCE = re.compile(rf"^(?P<name>{_NAME})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>.*))?\Z", re.ASCII)
_SHA256 = re.compile(r"^sha256:[a-f0-9]{64}\Z")
_NAME_MAX = 255  # reference.go RepositoryNameTotalLengthMax
DIGEST_EXAMPLE = "sha256:<64 hex digits>"
DIGEST_HOW = "`crane digest <image>` or `skopeo inspect --format '{{.Digest}}' docker://<image>`"


@dataclass(frozen=True)
class ImageRef:
    name: str
    tag: Optional[str]
    digest: Optional[str]


def parse_image(reference: str) -> ImageRef:
    """`name[:tag][@sha256:<digest>]`, or ValueError saying what is wrong and what a valid one looks like."""
    match = _REFERENCE.match(reference)
    if not match:
        raise ValueError(f"{reference!r} is not an image reference: name[:tag][@{DIGEST_EXAMPLE}], e.g. "
                         f"nvcr.io/nvidia/cuda:12.9.1-base-ubi9@{DIGEST_EXAMPLE} (lowercase repository path)")
    name, tag, digest = match.group("name", "tag", "digest")
    if len(name) > _NAME_MAX:
        raise ValueError(f"{reference!r}: the repository name is longer than {_NAME_MAX} characters")
    if digest is not None and not _SHA256.match(digest):
        raise ValueError(f"{reference!r}: the digest {digest!r} must be {DIGEST_EXAMPLE} (lowercase), as "
                         f"{DIGEST_HOW} prints it")
    return ImageRef(name, tag, digest)


def check_image(reference: str) -> str:
    parse_image(reference)
    return reference


def unpinned_image_warning(key: str, reference: str) -> Optional[str]:
    """One line when `reference` can move under the same name (no digest), else None."""
    if parse_image(reference).digest:
        return None
    return (f"{key} {reference} is pulled by tag, which the registry can move: pin it by digest, "
            f"{key}: {reference}@{DIGEST_EXAMPLE} ({DIGEST_HOW})")


def _scheme(value: str) -> Optional[str]:
    return value.split("://", 1)[0].lower() if "://" in value else None


def check_repo(repo: str) -> str:
    """A chart repository: empty (the chart names its own source), https:// or oci://."""
    if not repo:
        return repo
    url = urllib.parse.urlsplit(repo)
    if url.scheme not in ("https", "oci") or not url.hostname:
        raise ValueError(f"{repo!r} must be an https:// chart repository or an oci:// registry (charts over "
                         f"http:// or from file:// can be swapped unnoticed; a local chart goes in `chart` as a "
                         f"path, in the local environment only)")
    return repo


def check_chart(chart: str) -> str:
    """The chart on its own: a name, a local path, an https:// .tgz URL, or oci://<registry>/<path>/<chart> (optionally
    @sha256: digest); chart_problems checks it against `repo` and `version`."""
    scheme = _scheme(chart)
    if scheme is None or (scheme == "https" and urllib.parse.urlsplit(chart).hostname):
        return chart
    if scheme != "oci":
        raise ValueError(f"{chart!r}: a chart comes from an https:// repository (`repo`) or an oci:// registry "
                         f"(oci://<registry>/<path>/<chart>[@{DIGEST_EXAMPLE}])")
    parse_image(chart[len("oci://"):])
    return chart


def chart_problems(chart: str, repo: str, version: str, local_environment: bool) -> list[tuple[str, str]]:
    """(key, message) for what `chart` says against `repo` and `version`, and a local chart outside the local
    environment."""
    scheme = _scheme(chart)
    if scheme is not None and repo:
        return [("chart", f"{chart!r} names its own source and `repo` is {repo!r} too: keep one of the two")]
    if scheme is None and repo and "/" in chart:
        return [("chart", f"{chart!r}: with `repo` set, give the chart's name only ({chart.rsplit('/', 1)[1]}); "
                          f"Helm looks it up in {repo}")]
    if scheme == "oci":
        tag = parse_image(chart[len("oci://"):]).tag
        if tag is not None and tag.replace("_", "+") != version:  # Helm writes a tag's + as _ (registry/reference.go)
            return [("chart", f"{chart!r} names tag {tag!r} but `version` is {version!r}: leave the tag out "
                              f"(`version` names it)")]
    if is_local_chart(chart, repo) and not local_environment:
        return [("chart", f"{chart!r} is not from an https:// repository or an oci:// registry: set `repo` (e.g. "
                          f"https://helm.ngc.nvidia.com/nvidia) or an oci:// chart; a local chart (or one from your "
                          f"own `helm repo add` list) only in the local environment, whose ibmCloud.endpoint is on "
                          f"127.0.0.1")]
    return []


def is_local_chart(chart: str, repo: str) -> bool:
    """From the operator's disk (or the operator's own `helm repo add` list), not from a pinned remote source."""
    return not repo and _scheme(chart) is None


def chart_reference(chart: str, repo: str) -> tuple[str, Optional[str]]:
    """(chart, repository URL) as pulumi-kubernetes' Release takes them: an oci:// repo is joined to the chart name,
    since the provider would look an index.yaml up in a repository URL (pulumi-kubernetes
    provider/pkg/provider/helm_release.go resolveChartName, locateChart)."""
    if repo.startswith("oci://"):
        return f"{repo.rstrip('/')}/{chart}", None
    return chart, repo or None
