"""`raytrain-eks lock` against a real registry on 127.0.0.1 (see conftest.py), and its failures.

Every failure must print ONE line, exit 2 and leave environment.toml byte-for-byte unchanged.
"""
from __future__ import annotations

import http.server
import socketserver
import threading

import pytest

from raytrain_eks.cli import main
from raytrain_eks.verify.lock import rewrite_digest
from infra.lambdas.image_watcher.registry import ImageLocation, RegistryError, resolve_digest
from environment import load_environment

from oci_registry import free_port

OTHER = "sha256:" + "ab" * 32


def run_lock(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["lock", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_lock_pins_the_digest_of_the_pushed_image(spec_file, pushed, capsys):
    # given a spec whose tag was pushed to the local registry, and no digest yet
    before = spec_file.read_text()
    assert load_environment(spec_file).image.digest == ""
    # when
    code, out, err = run_lock(capsys, "--env", str(spec_file))
    # then the digest is the one we computed at push time, and only that line changed
    assert code == 0, err
    assert f"(unlocked) -> {pushed['v1']}" in out
    assert load_environment(spec_file).image.digest == pushed["v1"]
    changed = [(a, b) for a, b in zip(before.splitlines(), spec_file.read_text().splitlines()) if a != b]
    assert len(changed) == 1 and changed[0][1].startswith(f'digest = "{pushed["v1"]}"')
    assert changed[0][1].endswith("# written by `raytrain-eks lock`; runs are not reproducible until then")
    assert len(before.splitlines()) == len(spec_file.read_text().splitlines())


def test_lock_again_prints_old_to_new_and_rollback_pins_a_given_digest(spec_file, pushed, capsys):
    assert run_lock(capsys, "--env", str(spec_file))[0] == 0
    # when an operator rolls back to an earlier digest
    code, out, _ = run_lock(capsys, "--env", str(spec_file), "--digest", OTHER)
    assert code == 0 and f"{pushed['v1']} -> {OTHER}" in out
    assert load_environment(spec_file).image.reference.endswith(f"@{OTHER}")
    # and locks to the tag again later
    code, out, _ = run_lock(capsys, "--env", str(spec_file))
    assert code == 0 and f"{OTHER} -> {pushed['v1']}" in out


def test_a_multi_arch_tag_resolves_to_its_index_digest(registry, pushed):
    location = ImageLocation(registry_url=registry.url, name="deep-learning-containers/ray",
                             tag="train-ml-cuda-multi")
    assert resolve_digest(location) == pushed["multi"]
    assert pushed["multi"] != pushed["amd64"]


def test_lock_refuses_an_index_without_linux_amd64_and_pins_one_with_it(registry, pushed, spec_file, capsys):
    # given a tag whose index holds only linux/arm64 (what a GPU node of this project cannot run)
    from oci_registry import OCI_MANIFEST

    name = "deep-learning-containers/ray"
    size = registry.manifest_size(name, pushed["arm64"], OCI_MANIFEST)
    registry.push_index(name, "arm-only", {"arm64": (pushed["arm64"], size)})
    spec_file.write_text(spec_file.read_text().replace('tag = "train-ml-cuda-v1.1.0"', 'tag = "arm-only"'))
    # then lock refuses it, one line, file unchanged, naming what the index has
    assert_one_line_failure(capsys, spec_file, [], "without linux/amd64 (it has: linux/arm64)")
    # and the multi-arch tag with an amd64 entry is pinned (to its index digest)
    spec_file.write_text(spec_file.read_text().replace('tag = "arm-only"', 'tag = "train-ml-cuda-multi"'))
    code, _, err = run_lock(capsys, "--env", str(spec_file))
    assert code == 0, err
    assert load_environment(spec_file).image.digest == pushed["multi"]


def assert_one_line_failure(capsys, spec_file, argv, expected: str) -> None:
    before = spec_file.read_bytes()
    code, out, err = run_lock(capsys, "--env", str(spec_file), *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert expected in err and "unchanged" in err, err
    assert spec_file.read_bytes() == before


def test_wrong_tag_is_one_line_and_changes_nothing(spec_file, pushed, capsys):
    spec_file.write_text(spec_file.read_text().replace('tag = "train-ml-cuda-v1.1.0"', 'tag = "no-such-tag"'))
    assert_one_line_failure(capsys, spec_file, [], "tag not found: deep-learning-containers/ray:no-such-tag")


def test_unreachable_registry_is_one_line_and_changes_nothing(spec_file, capsys):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert_one_line_failure(capsys, spec_file, ["--registry-url", url], f"registry unreachable: {url}")


class _Garbage(http.server.BaseHTTPRequestHandler):
    """Answers every request like a broken proxy would; ``mode`` picks how."""

    mode = "html"

    def _reply(self, body: bool) -> None:
        if self.mode == "not-http":
            self.wfile.write(b"\x00\x01 this is not HTTP at all\r\n\r\n")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        if self.mode == "bad-digest":
            self.send_header("Docker-Content-Digest", "md5:12345")
        self.end_headers()
        if body:
            self.wfile.write(b"<html>Welcome to nginx!</html>")

    def do_HEAD(self):
        self._reply(body=False)

    def do_GET(self):
        self._reply(body=True)

    def log_message(self, *args):
        pass


@pytest.fixture
def garbage_server():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Garbage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("mode, expected", [
    ("html", "not an image manifest"),
    ("bad-digest", "Docker-Content-Digest 'md5:12345' is not sha256"),
    ("not-http", "malformed reply from deep-learning-containers/ray:train-ml-cuda-v1.1.0"),
])
def test_malformed_reply_is_one_line_and_changes_nothing(spec_file, garbage_server, capsys, mode, expected,
                                                          monkeypatch):
    monkeypatch.setattr(_Garbage, "mode", mode)
    assert_one_line_failure(capsys, spec_file, ["--registry-url", garbage_server], expected)


def test_bad_digest_argument_is_one_line(spec_file, capsys):
    assert_one_line_failure(capsys, spec_file, ["--digest", "sha256:XYZ"], "is not sha256:<64")


def test_rewrite_keeps_everything_but_the_digest():
    text = ('# top\n[cluster]\ndigest = "not-this-one"\n\n[image]  # the image\n'
            'repository = "r/x"\ntag = "t"\ndigest = ""   # note\n[storage]\n')
    new = rewrite_digest(text, OTHER)
    assert new == text.replace('digest = ""   # note', f'digest = "{OTHER}"   # note')
    # no digest line: inserted after the tag; no [image] table: appended
    assert rewrite_digest('[image]\ntag = "t"\nray_version = "2.58.0"\n', OTHER) == \
        f'[image]\ntag = "t"\ndigest = "{OTHER}"\nray_version = "2.58.0"\n'
    assert rewrite_digest('[cluster]\nname = "a"', OTHER) == f'[cluster]\nname = "a"\n\n[image]\ndigest = "{OTHER}"\n'
    # CRLF files stay CRLF
    assert rewrite_digest('[image]\r\ndigest = ""\r\n', OTHER) == f'[image]\r\ndigest = "{OTHER}"\r\n'


def test_registry_error_is_a_value_error():
    # the CLI and the Lambda catch it as a user-facing error, not a bug
    with pytest.raises(ValueError):
        ImageLocation.from_repository("no-slash", "t")
    assert issubclass(RegistryError, ValueError)
