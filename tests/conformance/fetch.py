"""Fetch vLLM's own scheduler tests from vLLM's source distribution.

The conformance tier runs `tests/v1/core/` of vLLM's sdist against our
scheduler classes. The repository vendors none of that code: this script
reads the sdist's link and sha256 from the package index pip is configured
with, downloads it with plain HTTP (`pip download --no-binary` would try to
build vLLM), checks the hash and keeps only the test files the tier imports.

    python tests/conformance/fetch.py 0.33.0 0.32.0    # idempotent; prints each tree

Each version lands in `<cache>/vllm-<version>/` (cache: $CONTINUUM_CONFORMANCE_CACHE,
else ~/.cache/vllm-continuum/vllm-tests), shared by every clone, so CI's fresh
clones do not download 45 MB per run. A tree is complete once its `.sha256`
stamp exists; then nothing is fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urldefrag

# What the four test files import from vLLM's test tree (utils.py needs the
# connector tests' utils for MockKVConfig). Never a conftest.py: vLLM's
# top-level one imports half of its test world; ours is conformance_plugin.py.
KEEP_DIRS = ("tests/v1/core/",)
KEEP_FILES = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/utils.py",
)
STAMP = ".sha256"


def cache_base() -> Path:
    """~/.cache/vllm-continuum (or under $XDG_CACHE_HOME): what every clone shares."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm-continuum"


def cache_root() -> Path:
    if env := os.environ.get("CONTINUUM_CONFORMANCE_CACHE"):
        return Path(env)
    return cache_base() / "vllm-tests"


def tree_dir(version: str) -> Path:
    return cache_root() / f"vllm-{version}"


def index_url() -> str:
    """The index pip would use (its config files and PIP_INDEX_URL), else PyPI."""
    try:
        from pip._internal.commands import create_command

        options, _ = create_command("download").parse_args([])
        return options.index_url
    except Exception:  # pip's internals moved: PyPI is what pip defaults to
        from pip._internal.models.index import PyPI

        return PyPI.simple_url


class _Links(HTMLParser):
    """The anchors of a PEP 503 (HTML) project page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a" and (href := dict(attrs).get("href")):
            self.hrefs.append(href)


def sdist_link(version: str, project: str = "vllm") -> tuple[str, str]:
    """(url, sha256) of <project>-<version>.tar.gz, read from the index's project page."""
    page = index_url().rstrip("/") + f"/{project}/"
    # PEP 691 JSON when the index speaks it, the PEP 503 HTML page otherwise.
    request = urllib.request.Request(page, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    with urllib.request.urlopen(request, timeout=120) as response:
        body = response.read()
        kind = response.headers.get("Content-Type", "")
    wanted = f"{project.replace('-', '_')}-{version}.tar.gz"
    if "json" in kind:
        files = [(f["url"], f.get("hashes", {}).get("sha256")) for f in json.loads(body)["files"]]
    else:
        parser = _Links()
        parser.feed(body.decode())
        files = []
        for href in parser.hrefs:
            url, fragment = urldefrag(href)
            files.append((url, fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None))
    for url, sha in files:
        if url.rsplit("/", 1)[-1] == wanted:
            if not sha:
                raise SystemExit(f"[conformance] {page} gives no sha256 for {wanted}")
            return urljoin(page, url), sha
    raise SystemExit(f"[conformance] {page} lists no {wanted}")


def download(url: str, sha: str, archive: Path) -> Path:
    """`url` saved at `archive`, its sha256 checked against `sha`."""
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=300) as response, archive.open("wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha:
        raise SystemExit(f"[fetch] sha256 mismatch for {url}: "
                         f"got {digest.hexdigest()}, the index says {sha}")
    return archive


def _kept(name: str, prefix: str) -> str | None:
    """The path inside the tree for a kept member of the sdist, else None."""
    if not name.startswith(prefix):
        return None
    rel = name[len(prefix):]
    if rel.endswith("/conftest.py"):
        return None
    if rel in KEEP_FILES or any(rel.startswith(d) and rel.endswith(".py") for d in KEEP_DIRS):
        return rel
    return None


def fetch(version: str) -> Path:
    target = tree_dir(version)
    if (target / STAMP).is_file():
        return target
    url, sha = sdist_link(version)
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"[conformance] fetching {url.rsplit('/', 1)[-1]} (tests only are kept)", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        archive = download(url, sha, Path(tmp) / "sdist.tar.gz")
        tree = Path(tmp) / "tree"
        with tarfile.open(archive) as tar:
            members = []
            for member in tar.getmembers():
                rel = _kept(member.name, f"vllm-{version}/")
                if rel and member.isfile():
                    member.name = rel
                    members.append(member)
            tar.extractall(tree, members=members, filter="data")
        missing = [f for f in KEEP_FILES if not (tree / f).is_file()]
        if missing:
            raise SystemExit(f"[conformance] vllm-{version}.tar.gz lacks {missing}")
        (tree / STAMP).write_text(f"{sha}  {url}\n")
        # Atomic: a concurrent or interrupted fetch never leaves half a tree.
        shutil.rmtree(target, ignore_errors=True)
        tree.rename(target)
    return target


if __name__ == "__main__":
    for v in sys.argv[1:] or ["0.33.0"]:
        print(fetch(v))
