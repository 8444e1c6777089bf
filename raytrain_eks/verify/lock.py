"""`raytrain-eks lock`: pin the spec's image to a digest (and roll back by pinning an older one).

Resolves ``[image] repository:tag`` through the registry's HTTP API (infra/lambdas/image_watcher/registry.py)
and rewrites ONLY the ``digest = "..."`` line of the ``[image]`` table of environment.toml:
comments, order and every other byte stay as they were. The new file is parsed and validated by
environment/ before it replaces the old one (atomically, same directory), so a failed lock leaves the
file byte-for-byte unchanged.

A multi-arch tag resolves to its index; an index without a linux/amd64 entry is refused (the GPU
nodes could not run it). ``--digest`` pins a given digest without asking the registry (the
pipeline's Synth step uses it to pin the digest a run deploys). With the pipeline, the promoted
digest is the source of truth: committing an older digest the pipeline already handled does not
roll back; an explicit run with ``IMAGE_DIGEST=sha256:<previous>`` does (README).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

_TABLE_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_DIGEST_LINE = re.compile(r"""^(?P<head>\s*digest\s*=\s*)(?P<value>"[^"\n]*"|'[^'\n]*')(?P<tail>.*)$""")
_TAG_LINE = re.compile(r"^\s*tag\s*=")


class LockError(ValueError):
    """A user-facing failure of `lock`; the message is one line."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="environment.toml", help="environment spec (default: %(default)s)")
    parser.add_argument("--registry-url", default="",
                        help="registry base URL, e.g. https://public.ecr.aws (default: https:// + "
                             "the host of image.repository)")
    parser.add_argument("--digest", default="",
                        help="pin this sha256:... instead of resolving the tag")
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds per registry request")


def rewrite_digest(text: str, digest: str) -> str:
    """``text`` with the [image] table's digest set to ``digest``; nothing else changes.

    Adds a ``digest`` line after ``tag`` (or after the header) when the table has none, and an
    ``[image]`` table at the end when the file has none.
    """
    lines = text.splitlines(keepends=True)
    start = end = None
    for i, line in enumerate(lines):
        header = _TABLE_HEADER.match(line)
        if header is None:
            continue
        if start is not None:
            end = i
            break
        if header.group(1) == "image" and not line.lstrip().startswith("[["):
            start = i
    if start is None:
        sep = "" if not text or text.endswith("\n") else "\n"
        return f'{text}{sep}\n[image]\ndigest = "{digest}"\n'
    end = len(lines) if end is None else end
    insert_at = start + 1
    for i in range(start + 1, end):
        match = _DIGEST_LINE.match(lines[i].rstrip("\r\n"))
        if match:
            newline = lines[i][len(lines[i].rstrip("\r\n")):]
            lines[i] = f'{match["head"]}"{digest}"{match["tail"]}{newline}'
            return "".join(lines)
        if _TAG_LINE.match(lines[i]):
            insert_at = i + 1
    newline = "\r\n" if lines[start].endswith("\r\n") else "\n"
    if insert_at == len(lines) and not lines[-1].endswith("\n"):
        lines[-1] += newline
    lines.insert(insert_at, f'digest = "{digest}"{newline}')
    return "".join(lines)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` in one rename: a reader sees the old file or the new one, never half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def lock(env_path: str, *, registry_url: str = "", digest: str = "", timeout: float = 15.0) -> tuple[str, str]:
    """Pin the digest in ``env_path``; returns ``(old, new)`` (old is ``""`` when unlocked).

    Raises SpecError for a bad spec, RegistryError / LockError for everything else; the file is
    only replaced once the new text has been validated.
    """
    import tomllib

    from environment.contract import DIGEST_PATTERN
    from infra.lambdas.image_watcher.registry import ImageLocation, platform_problem, resolve_digest
    from environment import environment_from_dict, load_environment

    env = load_environment(env_path)
    if digest:
        if not DIGEST_PATTERN.fullmatch(digest):
            raise LockError(f"--digest {digest!r} is not sha256:<64 lower-case hex digits>")
        new = digest
    else:
        location = ImageLocation.from_repository(env.image.repository, env.image.tag, registry_url)
        new = resolve_digest(location, timeout=timeout)
        # A multi-arch tag pins its index: the nodes can run it only if it has their platform.
        problem = platform_problem(location, new, timeout=timeout)
        if problem:
            raise LockError(problem)
    path = Path(env_path)
    raw = path.read_bytes()
    text = raw.decode("utf-8")
    # newline="" keeps CRLF files CRLF; decode() above did not translate them either.
    new_text = rewrite_digest(text, new)
    check = environment_from_dict(tomllib.loads(new_text), env_path)
    if check.image.digest != new or check.image.repository != env.image.repository:
        raise LockError(f"{env_path}: could not rewrite image.digest safely (file left unchanged)")
    if new_text != text:
        write_atomically(path, new_text)
    return env.image.digest, new


def run(args: argparse.Namespace) -> int:
    from infra.lambdas.image_watcher.registry import RegistryError

    try:
        old, new = lock(args.env, registry_url=args.registry_url, digest=args.digest, timeout=args.timeout)
    except (RegistryError, LockError) as err:
        print(f"error: {err} ({args.env} unchanged)", file=sys.stderr)
        return 2
    from environment import load_environment

    image = load_environment(args.env).image
    if old == new:
        print(f"{args.env}: image.digest already {new} ({image.repository}:{image.tag})")
    else:
        print(f"{args.env}: image.digest {old or '(unlocked)'} -> {new}")
        print(f"image {image.repository}@{new}  (tag {image.tag})")
    return 0
