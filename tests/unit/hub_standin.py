"""A local STAND-IN for the Hugging Face Hub, for tests only: not the Hub, not a mock of huggingface_hub.

It is a plain `http.server` that answers the subset of the Hub's HTTP API that `huggingface_hub` (2.x) sends for
`HfApi.create_repo`, `HfApi.upload_file` / `upload_folder` (preupload + ndjson commit, "regular" upload mode only:
no LFS/Xet), `/api/validate-yaml` (README.md metadata, checked by `upload_folder` in `Trainer.push_to_hub`) and
`hf_hub_download` / `get_hf_file_metadata` (HEAD and GET on `/{repo}/resolve/{revision}/{path}`), keeping the
repositories in memory. Point huggingface_hub at it with `HF_ENDPOINT=<url>` or `endpoint=<url>`. Requests it does not
know are answered 404 and recorded in `unknown`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import yaml

_BACKGROUND = ("/api/agent-harnesses", "/api/telemetry/")


class HubStandIn:
    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], dict[str, bytes]] = {}  # (repo_type, repo_id) -> {path: content}
        self.commits: list[dict] = []
        self.unknown: list[str] = []
        self.validated_cards: list[str] = []
        self.background: list[str] = []  # agent registry / telemetry requests, answered 404
        self.auth_headers: list[str | None] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                if "Content-Length" not in (headers or {}):
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, code: int, obj) -> None:
                self._send(code, json.dumps(obj).encode(), {"Content-Type": "application/json"})

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_POST(self):
                path = urlsplit(self.path).path
                hub.auth_headers.append(self.headers.get("Authorization"))
                if path == "/api/repos/create":
                    payload = json.loads(self._body())
                    repo_type = payload.get("type") or "model"
                    repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else \
                        payload["name"]
                    key = (repo_type, repo_id)
                    if key in hub.repos:
                        return self._json(409, {"error": "You already created this repo", "url": f"{hub.url}/{repo_id}"})
                    hub.repos[key] = {}
                    return self._json(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})
                if path == "/api/validate-yaml":  # README.md metadata: the front matter must be a YAML mapping
                    content = json.loads(self._body())["content"]
                    front = content.split("\n---", 1)[0].removeprefix("---\n") if content.startswith("---\n") else ""
                    try:
                        ok = front == "" or isinstance(yaml.safe_load(front), dict)
                    except yaml.YAMLError:
                        ok = False
                    hub.validated_cards.append(content)
                    if ok:
                        return self._json(200, {"errors": [], "warnings": []})
                    return self._json(400, {"errors": [{"message": "invalid YAML front matter"}], "warnings": []})
                m = re.fullmatch(r"/api/(model|dataset)s/([^/]+/[^/]+)/(preupload|commit)/([^/]+)", path)
                if not m:
                    hub.unknown.append(f"POST {self.path}")
                    return self._json(404, {"error": "stand-in: unknown route"})
                repo_type, repo_id, action, _revision = m.groups()
                files = hub.repos.get((repo_type, repo_id))
                if files is None:
                    return self._send(404, b'{"error": "Repository not found"}',
                                      {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"})
                body = self._body()
                if action == "preupload":
                    payload = json.loads(body)
                    return self._json(200, {"files": [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                        for f in payload["files"]
                    ]})
                lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                for item in lines:
                    if item["key"] == "file":
                        value = item["value"]
                        assert value.get("encoding", "base64") == "base64"
                        files[value["path"]] = base64.b64decode(value["content"])
                oid = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()
                hub.commits.append({"repo": (repo_type, repo_id), "oid": oid, "ops": lines})
                prefix = "" if repo_type == "model" else f"{repo_type}s/"
                return self._json(200, {"commitUrl": f"{hub.url}/{prefix}{repo_id}/commit/{oid}", "commitOid": oid})

            def _resolve(self, head: bool):
                path = unquote(urlsplit(self.path).path)
                if path.startswith(_BACKGROUND):  # huggingface_hub's own background requests: not part of the API used
                    hub.background.append(f"{self.command} {self.path}")
                    return self._json(404, {"error": "stand-in: not served"})
                m = re.fullmatch(r"/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if not m:
                    hub.unknown.append(f"{self.command} {self.path}")
                    return self._json(404, {"error": "stand-in: unknown route"})
                repo_type = "dataset" if m.group(1) else "model"
                files = hub.repos.get((repo_type, m.group(2)))
                if files is None:
                    return self._send(401, b"", {"X-Error-Code": "RepoNotFound"}, head)
                content = files.get(m.group(4))
                if content is None:
                    return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                commit = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()
                etag = hashlib.sha1(content).hexdigest()
                self._send(200, content, {"Content-Length": str(len(content)), "ETag": f'"{etag}"',
                                          "X-Repo-Commit": commit, "Content-Type": "application/octet-stream"},
                           head)

            def do_HEAD(self):
                self._resolve(head=True)

            def do_GET(self):
                self._resolve(head=False)

        return Handler
