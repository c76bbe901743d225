from __future__ import annotations

from livesupport import git_workspace


def test_read_file_round_trips_through_a_real_worker(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    ws = git_workspace(tmp_path / "repo", files={"a.txt": "hello\n"})
    worker_factory(owner, {"repo": ws}, slots=2)
    with api.client() as http:
        r = http.post(
            "/v1/workspace-tools/execute",
            headers=owner.auth | {"X-LibreChat-Code-Worker-ID": owner.worker_id},
            json={
                "protocolVersion": 1,
                "operation": "read_file",
                "workspaceId": "repo",
                "path": "a.txt",
            },
        )
    assert r.status_code == 200, r.text
    assert r.json()["content"] == "hello"
