"""Uploads leave no trace (app/ui/uploads.py): removed once read or after a minute, the
folder and each visitor's share capped, refused past the caps with a message; and only the
files this server took in as uploads are ever removed."""

from __future__ import annotations

import requests

from agent.testing import free_port
from app.ui.uploads import MB, UPLOADS, Uploads


def test_caps_refuse_with_a_message_and_count_what_is_held(tmp_path):
    uploads = Uploads(lifetime=60, folder_cap=10 * MB, visitor_cap=4 * MB)
    assert uploads.admit(1, "a", 3 * MB) is None
    (tmp_path / "h1").mkdir()
    (tmp_path / "h1" / "log.jsonl").write_bytes(b"x" * (3 * MB))
    uploads.done(1, [str(tmp_path / "h1" / "log.jsonl")])
    refused = uploads.admit(2, "a", 2 * MB)
    assert refused.startswith("Upload refused: your uploads would hold 5 MB") and "4 MB" in refused
    assert uploads.admit(3, "b", 4 * MB) is None  # another visitor has their own share
    assert uploads.admit(4, "c", 4 * MB).startswith("Upload refused: the studio's upload space")
    assert "Content-Length" in uploads.admit(5, "d", None)


def test_release_and_sweep_remove_only_recorded_uploads(tmp_path):
    uploads = Uploads(lifetime=60)
    mine = tmp_path / "hash1" / "run.csv"
    mine.parent.mkdir()
    mine.write_text("step,reward\n1,0.5\n")
    other = tmp_path / "bundled.jsonl"  # not an upload: never removed
    other.write_text("{}\n")
    uploads.admit(1, "a", 20)
    uploads.done(1, [str(mine)])
    assert uploads.release(mine) and not mine.exists() and not mine.parent.exists()
    assert not uploads.release(other) and other.exists()
    late = tmp_path / "hash2" / "late.csv"
    late.parent.mkdir()
    late.write_text("step,reward\n")
    uploads.admit(2, "a", 12)
    uploads.done(2, [str(late)])
    assert uploads.sweep() == 0 and late.exists()  # young: kept
    assert uploads.sweep(now=10**9) == 1 and not late.exists()  # a minute on: gone
    assert uploads.held() == 0


def test_a_bare_upload_to_the_studio_is_capped_and_swept(monkeypatch):
    from app.ui import build_app, launch_options

    class NoDocuments:
        def search(self, queries, topk=3):
            return [[] for _ in queries]

    monkeypatch.setattr(UPLOADS, "visitor_cap", 2 * MB)
    demo = build_app(lambda m: None, NoDocuments(), default_model="test/llds",
                     baseline_model="test/grpo")
    port = free_port()
    demo.launch(**launch_options(port=port, prevent_thread_lock=True, quiet=True))
    url = f"http://127.0.0.1:{port}/gradio_api/upload"
    try:
        first = requests.post(url, files={"files": ("a.jsonl", b"x" * MB)}, timeout=30)
        assert first.status_code == 200
        (path,) = first.json()
        assert UPLOADS.is_upload(path)
        second = requests.post(url, files={"files": ("b.jsonl", b"y" * (2 * MB))}, timeout=30)
        assert second.status_code == 413 and "Upload refused" in second.text
        UPLOADS.sweep(now=10**9)  # a minute later, unread
        from pathlib import Path

        assert not Path(path).exists() and UPLOADS.held() == 0
    finally:
        demo.close()
