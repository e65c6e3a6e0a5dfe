"""A small stand-in for the Hugging Face Hub HTTP API on 127.0.0.1, enough for push + download.

Endpoints: repo create, validate-yaml, preupload (always "regular"), commit (NDJSON, base64 inline), branch create,
model info / tree, and ``resolve`` (HEAD/GET). ``fail_commits = True`` makes commits answer 500. Every request's
Authorization header is recorded (the tests check a token was sent, and that it was never written anywhere).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

# -------------------------------------------------------------- a client process talking to the stand-in
TOKEN = "hf_standinSECRETtoken0123456789abcdefXYZ"


def hub_env(url: str, home: Path) -> dict:
    env = dict(os.environ)
    env.update(
        HF_ENDPOINT=url,
        HF_HUB_OFFLINE="0",
        HF_HOME=str(home),
        HF_TOKEN=TOKEN,
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
        HF_HUB_ETAG_TIMEOUT="5",
        HF_HUB_DOWNLOAD_TIMEOUT="10",
        TOKENIZERS_PARALLELISM="false",
    )
    env.pop("HF_DATASETS_OFFLINE", None)
    return env


def cli(args, env, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "hf_cocodr", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


class HubState:
    def __init__(self):
        self.repos: dict[str, dict] = {}
        self.fail_commits = False
        self.auth_headers: list[str] = []
        self.commits: list[dict] = []
        self.unknown: list[str] = []
        self.lock = threading.Lock()


def _sha(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


class Handler(BaseHTTPRequestHandler):
    state: HubState
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    # ------------------------------------------------------------------ helpers
    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            return self.rfile.read(n)
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return b""

    def _send(self, code: int, payload=None, headers: dict | None = None, raw: bytes | None = None, head=False):
        data = raw if raw is not None else (json.dumps(payload).encode() if payload is not None else b"")
        self.send_response(code)
        if raw is None:
            self.send_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def _record(self):
        auth = self.headers.get("Authorization")
        if auth:
            self.state.auth_headers.append(auth)

    # ------------------------------------------------------------------ routes
    def do_POST(self):
        self._record()
        path = urlparse(self.path).path
        body = self._body()
        st = self.state
        if path == "/api/repos/create":
            req = json.loads(body or b"{}")
            repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
            with st.lock:
                if repo in st.repos:
                    return self._send(409, {"error": "You already created this model repo", "url": f"/{repo}"})
                private = bool(req.get("private")) or req.get("visibility") == "private"
                st.repos[repo] = {"private": private, "branches": {"main": {}}, "heads": {"main": _sha(repo.encode())}}
            return self._send(200, {"url": f"http://{self.headers['Host']}/{repo}", "name": repo})
        if path == "/api/validate-yaml":
            return self._send(200, {"errors": [], "warnings": []})
        m = re.match(r"^/api/models/(.+?)/preupload/([^/]+)$", path)
        if m:
            files = json.loads(body)["files"]
            return self._send(
                200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
            )
        m = re.match(r"^/api/models/(.+?)/commit/([^/]+)$", path)
        if m:
            repo, rev = m.group(1), unquote(m.group(2))
            if st.fail_commits:
                return self._send(500, {"error": "Internal Error - the stand-in was told to fail"})
            if repo not in st.repos:
                return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            files, summary = {}, None
            for line in body.decode().splitlines():
                if not line.strip():
                    continue
                item = json.loads(line)
                if item["key"] == "header":
                    summary = item["value"].get("summary")
                elif item["key"] == "file":
                    v = item["value"]
                    files[v["path"]] = base64.b64decode(v["content"])
                elif item["key"] == "lfsFile":
                    return self._send(400, {"error": "the stand-in only takes regular uploads"})
            with st.lock:
                branch = st.repos[repo]["branches"].setdefault(rev, dict(st.repos[repo]["branches"]["main"]))
                branch.update(files)
                oid = _sha(json.dumps(sorted(branch)).encode() + str(len(st.commits)).encode())
                st.repos[repo]["heads"][rev] = oid
                st.repos[repo].setdefault("snapshots", {})[oid] = dict(branch)
                st.commits.append({"repo": repo, "revision": rev, "summary": summary, "files": sorted(files)})
            return self._send(
                200,
                {"commitUrl": f"http://{self.headers['Host']}/{repo}/commit/{oid}", "commitOid": oid, "success": True},
            )
        m = re.match(r"^/api/models/(.+?)/branch/([^/]+)$", path)
        if m:
            repo, branch = m.group(1), unquote(m.group(2))
            with st.lock:
                if repo not in st.repos:
                    return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                br = st.repos[repo]["branches"]
                if branch in br:
                    return self._send(409, {"error": "Reference already exists"})
                br[branch] = dict(br["main"])
                st.repos[repo]["heads"][branch] = st.repos[repo]["heads"]["main"]
            return self._send(200, {})
        st.unknown.append(f"POST {path}")
        return self._send(404, {"error": f"stand-in: unknown endpoint POST {path}"})

    def do_HEAD(self):
        self._get(head=True)

    def do_GET(self):
        self._get(head=False)

    def _files(self, repo: str, rev: str) -> dict | None:
        """Files at a branch name or a commit hash."""
        r = self.state.repos.get(repo)
        if r is None:
            return None
        return r["branches"].get(rev) if rev in r["branches"] else r.get("snapshots", {}).get(rev)

    def _head(self, repo: str, rev: str) -> str:
        return self.state.repos[repo]["heads"].get(rev, rev)

    def _get(self, head: bool):
        self._record()
        path = unquote(urlparse(self.path).path)
        st = self.state
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$", path)
        if m:
            repo, rev = m.group(1), m.group(2) or "main"
            files = self._files(repo, rev)
            if files is None:
                return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head=head)
            return self._send(
                200,
                {
                    "id": repo,
                    "modelId": repo,
                    "sha": self._head(repo, rev),
                    "private": st.repos[repo]["private"],
                    "siblings": [{"rfilename": p, "size": len(b)} for p, b in sorted(files.items())],
                },
                head=head,
            )
        m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$", path)
        if m:
            repo, rev = m.group(1), m.group(2)
            files = self._files(repo, rev)
            if files is None:
                return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head=head)
            return self._send(
                200,
                [{"type": "file", "path": p, "size": len(b), "oid": _sha(b)} for p, b in sorted(files.items())],
                head=head,
            )
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            repo, rev, fpath = m.groups()
            if repo not in st.repos:
                return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head=head)
            files = self._files(repo, rev)
            if files is None:
                return self._send(
                    404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"}, head=head
                )
            if fpath not in files:
                return self._send(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"}, head=head)
            data = files[fpath]
            headers = {
                "X-Repo-Commit": self._head(repo, rev),
                "ETag": f'"{_sha(data)}"',
                "Content-Type": "application/octet-stream",
            }
            return self._send(200, headers=headers, raw=data, head=head)
        st.unknown.append(f"GET {path}")
        return self._send(404, {"error": f"stand-in: unknown endpoint GET {path}"}, head=head)


def start(state: HubState | None = None) -> tuple[ThreadingHTTPServer, HubState, str]:
    state = state or HubState()
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, state, f"http://127.0.0.1:{server.server_address[1]}"
