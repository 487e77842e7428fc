"""`python -m app.deploy`: the dry run lists exactly the tracked files with their sizes,
and the tracked links it skips; offline the real run stops in seconds naming the Hub, the
upload sends the tracked files and nothing else (never through a symbolic link), and
`.gitattributes` marks every large tracked file as a large file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app import deploy
from app.deploy import LARGE_BYTES, DeployError, TrackedFile, tracked_files

ROOT = Path(__file__).resolve().parent.parent


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A git checkout: a small and a large tracked file, an untracked file, a tracked link
    that points out of the checkout, and a tracked file deleted from the working tree."""
    root = tmp_path / "repo"
    (root / "weights").mkdir(parents=True)
    (root / "app.py").write_text("print('hi')\n")
    with (root / "weights" / "model.safetensors").open("wb") as handle:
        handle.truncate(LARGE_BYTES + 1)
    (root / "gone.txt").write_text("x")
    outside = tmp_path / "secret.txt"
    outside.write_text("not for the Space")
    (root / "link.txt").symlink_to(outside)
    git(root, "init", "-q")
    git(root, "add", "app.py", "weights/model.safetensors", "gone.txt", "link.txt")
    (root / "gone.txt").unlink()
    (root / "untracked.txt").write_text("stays here")
    return root


def run_deploy(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.deploy", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_tracked_files_are_the_tracked_ones_inside_the_checkout(checkout):
    files = tracked_files(checkout)
    assert [f.path for f in files] == ["app.py", "weights/model.safetensors"]
    assert [f.large for f in files] == [False, True]
    assert files[1].size == LARGE_BYTES + 1


def test_dry_run_lists_files_sizes_total_and_the_large_ones(checkout):
    result = run_deploy("--space", "me/studio", "--dry-run", "--root", str(checkout))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("app.py") and lines[0].endswith("12 B")
    assert lines[1].startswith("weights/model.safetensors") and lines[1].endswith("10.0 MB  large")
    assert lines[2].startswith("2 files, 10.0 MB in all, to the Space me/studio; 1 large")
    # The tracked link is named as skipped, not listed for upload, and its target unsaid.
    assert lines[3:] == ["Skipped 1 tracked path, not uploaded:",
                         "  link.txt  (a symbolic link: links are not uploaded (the Space "
                         "would get the bytes of what it points to))"]
    for absent in ("untracked.txt", "gone.txt", "secret"):
        assert absent not in result.stdout


def test_dry_run_of_this_checkout_marks_the_shipped_weights_large():
    result = run_deploy("--space", "me/studio", "--dry-run")
    assert result.returncode == 0, result.stderr
    weights = [line for line in result.stdout.splitlines()
               if line.startswith("assets/nano-agent/model.safetensors")]
    assert weights and weights[0].endswith("large")
    assert "test-artifacts/" not in result.stdout  # ignored, so never uploaded


def test_offline_the_real_run_fails_at_once_naming_the_hub(checkout):
    started = time.monotonic()
    result = run_deploy("--space", "me/studio", "--root", str(checkout),
                        env={"HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_unused"})
    assert result.returncode == 1
    assert "Hugging Face Hub" in result.stderr and "HF_HUB_OFFLINE" in result.stderr
    assert time.monotonic() - started < 20


def test_an_unreachable_hub_fails_in_seconds_naming_its_address(checkout):
    """No offline flag, but nothing answers at the Hub's address (a closed local port)."""
    from agent.testing import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"
    env = {"HF_ENDPOINT": endpoint, "HF_TOKEN": "hf_unused"}
    env_without_offline = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "app.deploy", "--space", "me/studio",
                             "--root", str(checkout)], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env={**env_without_offline, **env})
    assert result.returncode == 1
    assert f"Hugging Face Hub ({endpoint}) cannot be reached" in result.stderr
    assert "Nothing was uploaded" in result.stderr
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("space", ["studio", "me/", "/etc/passwd", "me/../x", "a/b/c"])
def test_a_bad_space_name_is_refused_before_any_work(space):
    result = run_deploy("--space", space, "--dry-run")
    assert result.returncode == 2
    assert "is not OWNER/NAME" in result.stderr


def test_a_directory_that_is_no_checkout_is_refused(tmp_path):
    result = run_deploy("--space", "me/studio", "--dry-run", "--root", str(tmp_path))
    assert result.returncode == 2
    assert "not a git checkout" in result.stderr


class RecordingApi:
    """Stands in for `huggingface_hub.HfApi`: records the calls the upload makes."""

    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))

    def create_commit(self, repo_id, operations, **kwargs):
        self.calls.append(("create_commit", repo_id, list(operations), kwargs))
        return type("Info", (), {"commit_url": f"https://hub.example/{repo_id}/commit/1"})()


def test_upload_sends_the_tracked_files_and_nothing_else(checkout):
    api = RecordingApi()
    files = tracked_files(checkout)
    url = deploy.upload(api, checkout, files, "me/studio")
    assert url == "https://hub.example/me/studio/commit/1"
    (_, repo, created), (_, same, operations, options) = api.calls
    assert repo == same == "me/studio"
    assert created == {"repo_type": "space", "space_sdk": "gradio", "exist_ok": True}
    assert options["repo_type"] == "space"
    assert [op.path_in_repo for op in operations] == ["app.py", "weights/model.safetensors"]
    assert [Path(op.path_or_fileobj) for op in operations] == [checkout / "app.py",
                                                               checkout / "weights" /
                                                               "model.safetensors"]


@pytest.fixture
def leaky_checkout(tmp_path) -> Path:
    """A committed checkout with an untracked `.env` holding a token, a tracked link to it
    inside the checkout, and a tracked file whose directory was swapped for a link to an
    untracked one after the commit."""
    root = tmp_path / "repo"
    (root / "conf").mkdir(parents=True)
    (root / "app.py").write_text("print('hi')\n")
    (root / "conf" / "settings.txt").write_text("debug = false\n")
    (root / ".env").write_text("HF_TOKEN=hf_FAKE\n")
    (root / "innocent.txt").symlink_to(".env")
    (root / ".gitignore").write_text(".env\n.secrets/\n")
    git(root, "init", "-q")
    git(root, "add", "app.py", "conf/settings.txt", "innocent.txt", ".gitignore")
    git(root, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "x")
    (root / ".secrets").mkdir()
    (root / ".secrets" / "settings.txt").write_text("HF_TOKEN=hf_FAKE_TOO\n")
    (root / "conf" / "settings.txt").unlink()
    (root / "conf").rmdir()
    (root / "conf").symlink_to(".secrets")
    return root


def test_a_tracked_link_to_an_untracked_secret_is_skipped_and_said(leaky_checkout):
    result = run_deploy("--space", "me/studio", "--dry-run", "--root", str(leaky_checkout))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(".gitignore") and lines[1].startswith("app.py")
    assert lines[2].startswith("2 files, ")
    assert lines[3] == "Skipped 2 tracked paths, not uploaded:"
    assert lines[4].startswith("  conf/settings.txt  (under the symbolic link conf: ")
    assert lines[5].startswith("  innocent.txt  (a symbolic link: links are not uploaded")
    assert len(lines) == 6
    assert "hf_FAKE" not in result.stdout and ".env" not in result.stdout


def test_upload_reads_no_bytes_through_a_link(leaky_checkout):
    api = RecordingApi()
    deploy.upload(api, leaky_checkout, tracked_files(leaky_checkout), "me/studio")
    operations = api.calls[1][2]
    assert [op.path_in_repo for op in operations] == [".gitignore", "app.py"]
    for op in operations:
        assert b"hf_FAKE" not in Path(op.path_or_fileobj).read_bytes()


def test_upload_refuses_a_file_swapped_for_a_link_after_it_was_listed(leaky_checkout):
    files = tracked_files(leaky_checkout)
    (leaky_checkout / "app.py").unlink()
    (leaky_checkout / "app.py").symlink_to(".env")
    api = RecordingApi()
    with pytest.raises(DeployError, match="app.py is a symbolic link now"):
        deploy.upload(api, leaky_checkout, files, "me/studio")
    assert api.calls == []  # not even the Space was created


def test_every_large_tracked_file_is_a_large_file_in_gitattributes():
    large = [f.path for f in tracked_files(ROOT) if f.large]
    assert "assets/nano-agent/model.safetensors" in large
    probes = ["x.bin", "x.pt", "x.parquet", "x.arrow", "index/x.index", "run/events.out.tfevents.1"]
    attrs = subprocess.run(["git", "-C", str(ROOT), "check-attr", "filter", "--", *large,
                            *probes], capture_output=True, text=True, check=True).stdout
    for line in attrs.splitlines():
        assert line.endswith("filter: lfs"), line
    assert len(attrs.splitlines()) == len(large) + len(probes)


def test_sizes_read_as_a_person_writes_them():
    assert deploy.human_size(12) == "12 B"
    assert deploy.human_size(2048) == "2.0 KB"
    assert TrackedFile("a", 5 * 1024 ** 3).large
