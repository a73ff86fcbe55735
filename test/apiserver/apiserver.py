#!/usr/bin/env python3
"""A Kubernetes API server for sluice's tests (kube-apiserver cannot be
installed here). It serves the part of the core/v1 API the node agent uses,
with the semantics the agent's client relies on:

  * pods and namespaces, one global resourceVersion that grows with every
    change (as etcd's revision does);
  * GET of one object; list with fieldSelector / labelSelector,
    resourceVersion ("" most recent, "0" any, N not older than N, or exactly N
    with resourceVersionMatch=Exact), limit / continue (pages of one
    consistent snapshot; a continue token older than the compaction answers
    410 Expired);
  * watch=1 streams (chunked, one JSON event per line): ADDED / MODIFIED /
    DELETED, with a field selector's transitions (an object that starts or
    stops matching is ADDED / DELETED), BOOKMARK when allowWatchBookmarks, and
    timeoutSeconds; a resourceVersion older than the compaction window gets a
    410 -- as an ERROR event (what the watch cache does) or, with
    gone_mode=http, as the HTTP status;
  * PATCH with application/merge-patch+json (RFC 7386) on pods/NAME and
    pods/NAME/status (status keeps the spec as it was), with a
    metadata.resourceVersion precondition (409), and with
    application/json-patch+json (RFC 6902: add, remove, replace, move, copy,
    test) on any object: a malformed patch is 400 BadRequest, one that does
    not apply (a failed "test", a missing path) 422 Invalid, as
    kube-apiserver's patch handler answers;
  * nodes (GET, list, PATCH) and apps/v1 daemonsets (GET, list; deleting
    one is done through the admin port: gone, 404, or a
    metadata.deletionTimestamp set by a patch, as a deletion with
    finalizers leaves it);
  * bearer tokens checked on every request against DIR/tokens (re-read each
    time, so tests rotate them), 401 with a Status otherwise;
  * TLS with a CA and a server certificate made per run (openssl CLI).

Errors are Status objects, as kube-apiserver sends them.

Tests drive it through a plain-HTTP admin port on 127.0.0.1: create / update
/ patch / delete objects (several at once, atomically), compact, inject
faults (drop open watch streams, stall them, slow them down, fail the next N
requests, go down and come back), send bookmarks, and read what was patched
and which requests came in.

Usage: apiserver.py --dir DIR [--window N]
Writes DIR/ca.crt, DIR/other-ca.crt (a CA that signed nothing), DIR/token
(an accepted token), then DIR/ready.json {"api_port", "admin_port", "pid"}.
"""

import argparse
import base64
import copy
import ctypes
import datetime
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_object(code, reason, message, details=None):
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
         "message": message, "reason": reason, "code": code}
    if details:
        s["details"] = details
    return s


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.status = status_object(code, reason, message, details)
        self.code = code


def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


KINDS = {
    "pods": {"kind": "Pod", "list": "PodList", "namespaced": True, "singular": "pods", "apiVersion": "v1"},
    "namespaces": {"kind": "Namespace", "list": "NamespaceList", "namespaced": False, "singular": "namespaces",
                   "apiVersion": "v1"},
    "nodes": {"kind": "Node", "list": "NodeList", "namespaced": False, "singular": "nodes", "apiVersion": "v1"},
    "daemonsets": {"kind": "DaemonSet", "list": "DaemonSetList", "namespaced": True, "singular": "daemonsets",
                   "apiVersion": "apps/v1"},
}

FIELDS = {
    "pods": {
        "metadata.name": lambda o: o["metadata"].get("name", ""),
        "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
        "spec.nodeName": lambda o: o.get("spec", {}).get("nodeName", ""),
        "spec.serviceAccountName": lambda o: o.get("spec", {}).get("serviceAccountName", ""),
        "spec.hostNetwork": lambda o: "true" if o.get("spec", {}).get("hostNetwork") else "false",
        "status.phase": lambda o: o.get("status", {}).get("phase", ""),
        "status.podIP": lambda o: o.get("status", {}).get("podIP", ""),
    },
    "namespaces": {
        "metadata.name": lambda o: o["metadata"].get("name", ""),
        "status.phase": lambda o: o.get("status", {}).get("phase", ""),
    },
    "nodes": {
        "metadata.name": lambda o: o["metadata"].get("name", ""),
        "spec.unschedulable": lambda o: "true" if o.get("spec", {}).get("unschedulable") else "false",
    },
    "daemonsets": {
        "metadata.name": lambda o: o["metadata"].get("name", ""),
        "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
    },
}


class PatchError(Exception):
    pass


def _pointer(path):
    """RFC 6901: "/a/b~1c" -> ["a", "b/c"]."""
    if path == "":
        return []
    if not isinstance(path, str) or not path.startswith("/"):
        raise PatchError("invalid JSON pointer %r" % (path,))
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _parent(doc, tokens, path):
    cur = doc
    for t in tokens[:-1]:
        if isinstance(cur, dict) and t in cur:
            cur = cur[t]
        elif isinstance(cur, list) and t.isdigit() and int(t) < len(cur):
            cur = cur[int(t)]
        else:
            raise PatchError("doc is missing path: %s" % path)
    return cur


def _get(doc, path):
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError("doc is missing path: %s" % path)


def _remove(doc, path):
    tokens = _pointer(path)
    parent = _parent(doc, tokens, path)
    last = tokens[-1] if tokens else None
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last is not None and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError("unable to remove nonexistent key: %s: missing value" % path)


def _add(doc, path, value, replace=False):
    tokens = _pointer(path)
    if not tokens:
        return value
    parent = _parent(doc, tokens, path)
    last = tokens[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError("replace operation does not apply: doc is missing key: %s" % path)
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise PatchError("unable to access invalid index: %s" % last)
    else:
        raise PatchError("doc is missing path: %s" % path)
    return doc


def json_patch(target, ops):
    """RFC 6902 JSON patch; PatchError when an operation does not apply."""
    doc = copy.deepcopy(target)
    for op in ops:
        kind = op.get("op")
        path = op.get("path")
        if kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError("testing value %s failed: test failed" % path)
        elif kind == "remove":
            _remove(doc, path)
        elif kind in ("add", "replace"):
            if "value" not in op:
                raise PatchError("missing value for %s" % kind)
            doc = _add(doc, path, copy.deepcopy(op["value"]), replace=kind == "replace")
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_get(doc, op.get("from")))
            if kind == "move":
                _remove(doc, op.get("from"))
            doc = _add(doc, path, value)
        else:
            raise PatchError("Unexpected kind: %s" % kind)
    return doc


def parse_field_selector(kind, text):
    """'a=b,c!=d' -> predicate; 400 for a field the kind does not index."""
    reqs = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        if "!=" in part:
            field, value = part.split("!=", 1)
            negate = True
        elif "==" in part:
            field, value = part.split("==", 1)
            negate = False
        elif "=" in part:
            field, value = part.split("=", 1)
            negate = False
        else:
            raise ApiError(400, "BadRequest", "invalid field selector: %r" % part)
        getter = FIELDS[kind].get(field.strip())
        if getter is None:
            raise ApiError(400, "BadRequest", '"%s" is not a known field selector: only "%s"'
                           % (field.strip(), ", ".join(sorted(FIELDS[kind]))))
        reqs.append((getter, value.strip(), negate))
    return lambda o: all((g(o) == v) != neg for g, v, neg in reqs)


def parse_label_selector(text):
    """Equality and existence requirements: a=b, a==b, a!=b, a, !a."""
    reqs = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        if " in " in part or " notin " in part or "(" in part:
            raise ApiError(400, "BadRequest", "set-based label selectors are not supported here: %r" % part)
        if "!=" in part:
            k, v = part.split("!=", 1)
            reqs.append(lambda l, k=k.strip(), v=v.strip(): l.get(k) != v)
        elif "=" in part:
            k, v = part.replace("==", "=").split("=", 1)
            reqs.append(lambda l, k=k.strip(), v=v.strip(): l.get(k) == v)
        elif part.startswith("!"):
            reqs.append(lambda l, k=part[1:].strip(): k not in l)
        else:
            reqs.append(lambda l, k=part: k in l)
    return lambda o: all(r(o["metadata"].get("labels") or {}) for r in reqs)


class Store:
    """Objects with their history, the event log, and the compaction point."""

    def __init__(self, window):
        self.cond = threading.Condition()
        self.rv = 1
        self.compacted = 0     # no event at or below this version is kept
        self.window = window   # keep at most this many events (0: all)
        self.history = {}      # (kind, ns, name) -> [(rv, obj or None)]
        self.events = []       # [(rv, kind, type, obj, prev)]
        self.patches = []

    # -- reading -----------------------------------------------------------------

    def current(self, key):
        h = self.history.get(key)
        return h[-1][1] if h else None

    def state_at(self, kind, rv):
        """Objects of a kind as they were at version rv (rv >= compacted)."""
        out = []
        for key, h in self.history.items():
            if key[0] != kind:
                continue
            obj = None
            for erv, o in h:
                if erv <= rv:
                    obj = o
                else:
                    break
            if obj is not None:
                out.append(obj)
        out.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return out

    # -- writing -----------------------------------------------------------------

    def _record(self, kind, key, etype, obj, prev):
        self.rv += 1
        if obj is not None:
            obj["metadata"]["resourceVersion"] = str(self.rv)
            stored = obj
        else:
            stored = None
        self.history.setdefault(key, []).append((self.rv, stored))
        event_obj = obj if obj is not None else dict(copy.deepcopy(prev))
        if obj is None:
            event_obj["metadata"]["resourceVersion"] = str(self.rv)
        self.events.append((self.rv, kind, etype, copy.deepcopy(event_obj), prev))
        if self.window and len(self.events) > self.window:
            self.compact(self.events[len(self.events) - self.window - 1][0])
        self.cond.notify_all()
        return event_obj

    def compact(self, to_rv):
        to_rv = min(to_rv, self.rv)
        if to_rv <= self.compacted:
            return
        self.compacted = to_rv
        self.events = [e for e in self.events if e[0] > to_rv]
        for key in list(self.history):
            h = self.history[key]
            base = [e for e in h if e[0] <= to_rv]
            rest = [e for e in h if e[0] > to_rv]
            h = base[-1:] + rest
            if h and h[0][1] is None and len(h) == 1:
                del self.history[key]
            else:
                self.history[key] = h
        self.cond.notify_all()

    @staticmethod
    def key_of(kind, obj):
        meta = obj.get("metadata") or {}
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        ns = meta.get("namespace", "") if KINDS[kind]["namespaced"] else ""
        if KINDS[kind]["namespaced"] and not ns:
            raise ApiError(422, "Invalid", "metadata.namespace: Required value")
        return (kind, ns, meta["name"])

    def create(self, kind, obj):
        obj = copy.deepcopy(obj)
        key = self.key_of(kind, obj)
        if self.current(key) is not None:
            raise ApiError(409, "AlreadyExists", '%s "%s" already exists' % (kind, key[2]))
        if KINDS[kind]["namespaced"] and self.current(("namespaces", "", key[1])) is None:
            raise ApiError(404, "NotFound", 'namespaces "%s" not found' % key[1])
        obj["kind"] = KINDS[kind]["kind"]
        obj["apiVersion"] = KINDS[kind]["apiVersion"]
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_iso())
        return self._record(kind, key, "ADDED", obj, None)

    def replace(self, kind, obj):
        obj = copy.deepcopy(obj)
        key = self.key_of(kind, obj)
        old = self.current(key)
        if old is None:
            raise ApiError(404, "NotFound", '%s "%s" not found' % (kind, key[2]))
        obj["kind"] = KINDS[kind]["kind"]
        obj["apiVersion"] = KINDS[kind]["apiVersion"]
        for f in ("uid", "creationTimestamp"):
            obj["metadata"][f] = old["metadata"][f]
        return self._record(kind, key, "MODIFIED", obj, old)

    def patch(self, kind, ns, name, patch, subresource="", json_patch_ops=False):
        key = (kind, ns, name)
        old = self.current(key)
        if old is None:
            raise ApiError(404, "NotFound", '%s "%s" not found' % (kind, name),
                           {"name": name, "kind": kind})
        if json_patch_ops:
            if not isinstance(patch, list) or not all(isinstance(o, dict) for o in patch):
                raise ApiError(400, "BadRequest", "json: cannot unmarshal into Go value of type jsonpatch.Patch")
            try:
                obj = json_patch(old, patch)
            except PatchError as e:
                raise ApiError(422, "Invalid", str(e))
            if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
                raise ApiError(422, "Invalid", "the patch leaves no object")
            want_rv = obj["metadata"].get("resourceVersion")
        else:
            if not isinstance(patch, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            want_rv = (patch.get("metadata") or {}).get("resourceVersion")
            obj = merge_patch(old, patch)
        if want_rv is not None and want_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", 'Operation cannot be fulfilled on %s "%s": the object has been modified; '
                           'please apply your changes to the latest version and try again' % (kind, name))
        for f in ("uid", "name", "namespace", "creationTimestamp"):
            if f in old["metadata"]:
                obj["metadata"][f] = old["metadata"][f]
        if subresource == "status" and "spec" in old:
            obj["spec"] = copy.deepcopy(old["spec"])  # the status subresource cannot change the spec
        obj["kind"] = KINDS[kind]["kind"]
        obj["apiVersion"] = KINDS[kind]["apiVersion"]
        if obj == old:
            return old  # a no-op patch does not bump the version (as the API server does)
        return self._record(kind, key, "MODIFIED", obj, old)

    def delete(self, kind, ns, name):
        key = (kind, ns, name)
        old = self.current(key)
        if old is None:
            raise ApiError(404, "NotFound", '%s "%s" not found' % (kind, name))
        if kind == "namespaces":
            for k in [k for k in self.history if k[0] == "pods" and k[1] == name and self.current(k) is not None]:
                self._record("pods", k, "DELETED", None, self.current(k))
        return self._record(kind, key, "DELETED", None, old)


class Faults:
    def __init__(self):
        self.fail = []            # [{"count", "status", "path"}]
        self.slow = 0.0           # seconds between bytes of a watch event
        self.stall_all = False    # new watches stall too
        self.gone_mode = "event"  # or "http"
        self.bookmark_interval = 0.0


class Watcher:
    def __init__(self, seq, bookmarks):
        self.seq = seq
        self.bookmarks = bookmarks
        self.drop = False
        self.stall = False
        self.bookmark_now = False


class State:
    def __init__(self, args):
        self.dir = args.dir
        self.store = Store(args.window)
        self.faults = Faults()
        self.watchers = {}
        self.watcher_seq = 0
        self.requests = []
        self.connections = set()
        self.connections_total = 0   # TLS connections accepted so far
        self.conn_lock = threading.Lock()
        self.api_server = None
        self.api_thread = None
        self.api_port = 0
        self.ssl_context = None

    def tokens(self):
        try:
            with open(os.path.join(self.dir, "tokens")) as f:
                return {line.strip() for line in f if line.strip()}
        except OSError:
            return set()


STATE = None


def send_json(handler, code, body):
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
    handler.wfile.flush()


def write_chunk(wfile, data):
    wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    wfile.flush()


class ApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sluice-test-apiserver"

    def setup(self):
        # Registered before the TLS handshake, and checked against the server
        # that is up: a connection accepted while the API server goes down
        # (api_down takes its list under conn_lock after clearing api_server)
        # is either in that list or sees itself stale here, and never
        # survives to carry a client's requests through the outage.
        with STATE.conn_lock:
            STATE.connections.add(self.request)
            STATE.connections_total += 1
            stale = self.server is not STATE.api_server
        if stale:
            self.request.shutdown(socket.SHUT_RDWR)
        # TLS handshake in the connection's own thread, so that a client that
        # connects and says nothing holds up no one else.
        try:
            self.request.do_handshake()
        except OSError:
            with STATE.conn_lock:
                STATE.connections.discard(self.request)
            raise
        super().setup()

    def finish(self):
        with STATE.conn_lock:
            STATE.connections.discard(self.request)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, fmt, *args):
        sys.stderr.write("api: %s\n" % (fmt % args))

    # -- plumbing ----------------------------------------------------------------

    def send_json(self, code, body):
        send_json(self, code, body)

    def send_error_status(self, err):
        self.send_json(err.code, err.status)

    def record(self, kind, status, token):
        with STATE.store.cond:
            STATE.requests.append({"time": time.time(), "method": self.command, "path": self.path,
                                   "kind": kind, "status": status, "token": token})

    def classify(self, parts, query):
        if self.command == "PATCH":
            return "patch"
        if query.get("watch", [""])[0] in ("1", "true"):
            return "watch"
        if parts[-1] in ("pods", "namespaces", "nodes", "daemonsets") and \
                (len(parts) in (3, 5) or parts[:3] == ["apis", "apps", "v1"]):
            return "list"
        return "get"

    def route(self):
        """(kind, namespace, name, subresource) of the path, or None."""
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        if parts[:3] == ["apis", "apps", "v1"]:
            rest = parts[3:]
            if rest == ["daemonsets"]:
                return ("daemonsets", "", "", ""), parts
            if len(rest) in (3, 4) and rest[0] == "namespaces" and rest[2] == "daemonsets":
                return ("daemonsets", rest[1], rest[3] if len(rest) == 4 else "", ""), parts
            return None, parts
        if parts[:2] != ["api", "v1"]:
            return None, parts
        rest = parts[2:]
        if rest == ["nodes"]:
            return ("nodes", "", "", ""), parts
        if len(rest) == 2 and rest[0] == "nodes":
            return ("nodes", "", rest[1], ""), parts
        if rest == ["pods"]:
            return ("pods", "", "", ""), parts
        if rest == ["namespaces"]:
            return ("namespaces", "", "", ""), parts
        if len(rest) == 2 and rest[0] == "namespaces":
            return ("namespaces", "", rest[1], ""), parts
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] == "pods":
            if len(rest) == 3:
                return ("pods", rest[1], "", ""), parts
            if len(rest) == 4:
                return ("pods", rest[1], rest[3], ""), parts
            if len(rest) == 5 and rest[4] == "status":
                return ("pods", rest[1], rest[3], "status"), parts
        return None, parts

    def handle_any(self):
        query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
        route, parts = self.route()
        kind = self.classify(parts, query)
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else ""
        body = b""
        if self.headers.get("Content-Length"):
            body = self.rfile.read(int(self.headers["Content-Length"]))
        if not token or token not in STATE.tokens():
            self.record(kind, 401, token)
            return self.send_json(401, status_object(401, "Unauthorized", "Unauthorized"))
        with STATE.store.cond:
            injected = None
            for f in STATE.faults.fail:
                if f["count"] > 0 and self.path.startswith(f.get("path", "")) and \
                        f.get("kind", kind) == kind:
                    f["count"] -= 1
                    injected = f["status"]
                    break
        if injected:
            self.record(kind, injected, token)
            return self.send_json(injected, status_object(injected, "InternalError",
                                                          "Internal error occurred: injected fault"))
        if route is None:
            self.record(kind, 404, token)
            return self.send_json(404, status_object(404, "NotFound", "the server could not find the requested resource"))
        try:
            if kind == "watch":
                self.record(kind, 200, token)
                return self.watch(route, query)
            if kind == "patch":
                result = self.patch(route, body)
            elif kind == "list":
                result = self.list(route, query)
            else:
                result = self.get(route)
            self.record(kind, 200, token)
            self.send_json(200, result)
        except ApiError as e:
            self.record(kind, e.code, token)
            self.send_error_status(e)

    def do_GET(self):
        self.handle_any()

    def do_PATCH(self):
        self.handle_any()

    # -- verbs -------------------------------------------------------------------

    def get(self, route):
        kind, ns, name, _ = route
        with STATE.store.cond:
            obj = STATE.store.current((kind, ns, name))
        if obj is None:
            raise ApiError(404, "NotFound", '%s "%s" not found' % (kind, name), {"name": name, "kind": kind})
        return obj

    def list(self, route, query):
        kind, ns, _, _ = route
        q = lambda k: query.get(k, [""])[0]
        match_field = parse_field_selector(kind, q("fieldSelector"))
        match_label = parse_label_selector(q("labelSelector"))
        limit = int(q("limit") or 0)
        store = STATE.store
        with store.cond:
            start = ""
            if q("continue"):
                try:
                    tok = json.loads(base64.urlsafe_b64decode(q("continue").encode()))
                    rv, start = int(tok["rv"]), tok["start"]
                except (ValueError, KeyError, TypeError):
                    raise ApiError(400, "BadRequest", "continue key is not valid")
                if rv < store.compacted:
                    raise ApiError(410, "Expired", "The provided continue parameter is too old to display a "
                                   "consistent list result. You can start a new list without the continue parameter.")
            else:
                want = q("resourceVersion")
                if q("resourceVersionMatch") == "Exact":
                    rv = int(want)
                    if rv < store.compacted:
                        raise ApiError(410, "Expired", "too old resource version: %d (%d)" % (rv, store.compacted))
                    if rv > store.rv:
                        raise ApiError(504, "Timeout", "Too large resource version: %d, current: %d" % (rv, store.rv))
                elif want not in ("", "0"):
                    if int(want) > store.rv:
                        raise ApiError(504, "Timeout", "Too large resource version: %s, current: %d" % (want, store.rv))
                    rv = store.rv
                else:
                    rv = store.rv
            objs = [o for o in store.state_at(kind, rv)
                    if (not ns or o["metadata"].get("namespace") == ns) and match_field(o) and match_label(o)]
        keyed = [("%s/%s" % (o["metadata"].get("namespace", ""), o["metadata"]["name"]), o) for o in objs]
        keyed = [(k, o) for k, o in keyed if k > start]
        meta = {"resourceVersion": str(rv)}
        if limit and len(keyed) > limit:
            page, rest = keyed[:limit], keyed[limit:]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps({"rv": rv, "start": page[-1][0]}).encode()).decode()
            meta["remainingItemCount"] = len(rest)
        else:
            page = keyed
        items = []
        for _, o in page:
            item = copy.deepcopy(o)
            item.pop("kind", None)  # list items carry no kind / apiVersion
            item.pop("apiVersion", None)
            items.append(item)
        return {"kind": KINDS[kind]["list"], "apiVersion": KINDS[kind]["apiVersion"], "metadata": meta, "items": items}

    def patch(self, route, body):
        kind, ns, name, sub = route
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype not in ("application/merge-patch+json", "application/json-patch+json"):
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                           "accepted media types include: application/json-patch+json, application/merge-patch+json")
        if not name:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        try:
            patch = json.loads(body or b"null")
        except ValueError as e:
            raise ApiError(400, "BadRequest", "error decoding patch: %s" % e)
        with STATE.store.cond:
            obj = STATE.store.patch(kind, ns, name, patch, sub, json_patch_ops=ctype == "application/json-patch+json")
            STATE.store.patches.append({"kind": kind, "namespace": ns, "name": name, "subresource": sub,
                                        "patch": patch, "contentType": ctype, "time": time.time()})
        return obj

    def watch(self, route, query):
        kind, ns, _, _ = route
        q = lambda k: query.get(k, [""])[0]
        match_field = parse_field_selector(kind, q("fieldSelector"))
        match_label = parse_label_selector(q("labelSelector"))
        matches = lambda o: o is not None and (not ns or o["metadata"].get("namespace") == ns) \
            and match_field(o) and match_label(o)
        bookmarks = q("allowWatchBookmarks") in ("true", "1")
        timeout = float(q("timeoutSeconds") or 1800)
        deadline = time.time() + timeout
        want = q("resourceVersion")
        store = STATE.store
        with store.cond:
            initial = []
            if want in ("", "0"):
                pos = store.rv
                initial = [("ADDED", o) for o in store.state_at(kind, pos) if matches(o)]
            else:
                pos = int(want)
                if pos < store.compacted:
                    gone = status_object(410, "Expired", "too old resource version: %d (%d)" % (pos, store.compacted))
                    if STATE.faults.gone_mode == "http":
                        raise ApiError(410, "Expired", gone["message"])
                    initial = [("ERROR", gone)]
            STATE.watcher_seq += 1
            me = Watcher(STATE.watcher_seq, bookmarks)
            me.stall = STATE.faults.stall_all
            STATE.watchers[me.seq] = me
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            if initial and initial[0][0] == "ERROR":
                self.send_event(me, "ERROR", initial[0][1])
                write_chunk(self.wfile, b"")
                return
            for etype, o in initial:
                self.send_event(me, etype, o)
            last_bookmark = time.time()
            while True:
                out = []
                with store.cond:
                    if not self.ready(me, store, pos, deadline, last_bookmark):
                        store.cond.wait(0.05)
                    if me.drop:
                        return self.drop_connection()
                    if pos < store.compacted:
                        # This watcher fell behind the compaction.
                        out.append(("ERROR", status_object(410, "Expired", "too old resource version: %d (%d)"
                                                           % (pos, store.compacted))))
                    else:
                        for erv, ekind, etype, obj, prev in store.events:
                            if erv <= pos or ekind != kind:
                                continue
                            now_m, was_m = matches(obj) if etype != "DELETED" else False, matches(prev)
                            if etype == "DELETED":
                                if was_m:
                                    out.append(("DELETED", obj))
                            elif now_m and was_m:
                                out.append(("MODIFIED", obj))
                            elif now_m:
                                out.append(("ADDED", obj))
                            elif was_m:
                                out.append(("DELETED", obj))
                        if store.events and store.events[-1][0] > pos:
                            pos = store.events[-1][0]
                        pos = max(pos, store.compacted)
                    send_bookmark = bookmarks and (me.bookmark_now or (
                        STATE.faults.bookmark_interval and time.time() - last_bookmark >= STATE.faults.bookmark_interval))
                    me.bookmark_now = False
                    current = store.rv
                if me.stall:
                    return self.stall(me, out)
                for etype, obj in out:
                    self.send_event(me, etype, obj)
                    if etype == "ERROR":
                        write_chunk(self.wfile, b"")
                        return
                if send_bookmark:
                    # Everything up to the current version has been looked at.
                    pos = max(pos, current)
                    self.send_event(me, "BOOKMARK", {"kind": KINDS[kind]["kind"], "apiVersion": KINDS[kind]["apiVersion"],
                                                     "metadata": {"resourceVersion": str(pos)}})
                    last_bookmark = time.time()
                if time.time() >= deadline:
                    write_chunk(self.wfile, b"")  # a clean end of the stream
                    return
        except (OSError, ssl.SSLError):
            return
        finally:
            with store.cond:
                STATE.watchers.pop(me.seq, None)
            self.close_connection = True

    @staticmethod
    def ready(me, store, pos, deadline, last_bookmark):
        return (me.drop or me.stall or me.bookmark_now or pos < store.compacted or time.time() >= deadline
                or (store.events and store.events[-1][0] > pos))

    def send_event(self, me, etype, obj):
        data = (json.dumps({"type": etype, "object": obj}) + "\n").encode()
        delay = STATE.faults.slow
        if delay > 0:
            for i in range(len(data)):
                write_chunk(self.wfile, data[i:i + 1])
                time.sleep(delay)
                if me.drop:
                    return self.drop_connection()
        else:
            write_chunk(self.wfile, data)

    def stall(self, me, pending):
        # Half of the next event goes out, then nothing: a stream that is
        # open but dead. Held until the client gives up or the test releases
        # it (which drops it).
        if pending:
            data = (json.dumps({"type": pending[0][0], "object": pending[0][1]}) + "\n").encode()
            write_chunk(self.wfile, data[:len(data) // 2])
        while not me.drop:
            time.sleep(0.05)
        self.drop_connection()

    def drop_connection(self):
        # No terminating chunk and no TLS close_notify: the client sees the
        # connection die in the middle of the stream.
        try:
            self.request.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close_connection = True


class AdminHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def send_json(self, code, body):
        send_json(self, code, body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def do_GET(self):
        store = STATE.store
        path = urlsplit(self.path).path
        with store.cond:
            if path == "/admin/state":
                return self.send_json(200, {"rv": store.rv, "compacted": store.compacted,
                                            "watchers": len(STATE.watchers), "up": STATE.api_server is not None,
                                            "events": len(store.events),
                                            "connections": STATE.connections_total})
            if path == "/admin/patches":
                return self.send_json(200, store.patches)
            if path == "/admin/requests":
                return self.send_json(200, STATE.requests)
            parts = path.strip("/").split("/")
            if parts[:2] == ["admin", "objects"] and len(parts) in (4, 5):
                kind = parts[2]
                key = (kind, parts[3], parts[4]) if len(parts) == 5 else (kind, "", parts[3])
                obj = store.current(key)
                return self.send_json(200 if obj else 404, obj or {"error": "not found"})
        self.send_json(404, {"error": "unknown admin path " + path})

    def do_POST(self):
        path = urlsplit(self.path).path
        try:
            body = self.body()
        except ValueError as e:
            return self.send_json(400, {"error": "bad JSON: %s" % e})
        if path == "/admin/apply":
            return self.apply(body)
        if path == "/admin/fault":
            return self.fault(body)
        self.send_json(404, {"error": "unknown admin path " + path})

    def apply(self, body):
        store = STATE.store
        results = []
        with store.cond:
            try:
                for op in body.get("ops", []):
                    kind = op["kind"]
                    if kind not in KINDS:
                        raise ApiError(400, "BadRequest", "unknown kind " + kind)
                    if op["op"] == "create":
                        results.append(store.create(kind, op["object"]))
                    elif op["op"] == "update":
                        results.append(store.replace(kind, op["object"]))
                    elif op["op"] == "patch":
                        results.append(store.patch(kind, op.get("namespace", ""), op["name"], op["patch"]))
                    elif op["op"] == "delete":
                        results.append(store.delete(kind, op.get("namespace", ""), op["name"]))
                    else:
                        raise ApiError(400, "BadRequest", "unknown op " + op["op"])
            except ApiError as e:
                return self.send_json(e.code, {"error": e.status["message"], "done": results})
            except (KeyError, TypeError) as e:
                return self.send_json(400, {"error": "bad op: %r" % e, "done": results})
        self.send_json(200, {"results": results, "rv": store.rv})

    def fault(self, body):
        store = STATE.store
        f = STATE.faults
        with store.cond:
            if "fail" in body:
                spec = dict(body["fail"])
                spec.setdefault("status", 500)
                f.fail.append(spec)
            if "clear_fail" in body:
                f.fail = []
            if "slow" in body:
                f.slow = float(body["slow"])
            if "gone_mode" in body:
                f.gone_mode = body["gone_mode"]
            if "bookmark_interval" in body:
                f.bookmark_interval = float(body["bookmark_interval"])
            if body.get("bookmark"):
                for w in STATE.watchers.values():
                    w.bookmark_now = True
            if "window" in body:
                store.window = int(body["window"])
            if "compact" in body:
                store.compact(store.rv if body["compact"] == "now" else int(body["compact"]))
            if "stall" in body:
                mode = body["stall"]
                if mode in ("open", "all"):
                    for w in STATE.watchers.values():
                        w.stall = True
                f.stall_all = mode == "all"
            if body.get("drop"):
                for w in STATE.watchers.values():
                    w.drop = True
            if "tokens" in body:
                tmp = os.path.join(STATE.dir, "tokens.tmp")
                with open(tmp, "w") as out:
                    out.write("".join(t + "\n" for t in body["tokens"]))
                os.rename(tmp, os.path.join(STATE.dir, "tokens"))
            store.cond.notify_all()
            dropped = len(STATE.watchers)
        if body.get("down"):
            api_down()
        if body.get("up"):
            api_up()
        self.send_json(200, {"ok": True, "watchers": dropped})


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def get_request(self):
        sock, addr = self.socket.accept()
        # Headers and body go out as separate writes: without NODELAY each
        # response would wait for the client's delayed ACK (~40 ms).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return STATE.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def handle_error(self, request, client_address):
        pass  # a client that went away mid-request is part of the tests


def api_up():
    if STATE.api_server is not None:
        return
    srv = ApiServer(("127.0.0.1", STATE.api_port), ApiHandler)
    STATE.api_port = srv.server_address[1]
    STATE.api_server = srv
    STATE.api_thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    STATE.api_thread.start()


def api_down():
    srv = STATE.api_server
    if srv is None:
        return
    STATE.api_server = None
    srv.shutdown()
    srv.server_close()
    with STATE.store.cond:
        for w in STATE.watchers.values():
            w.drop = True
        STATE.store.cond.notify_all()
    with STATE.conn_lock:
        conns = list(STATE.connections)
    for c in conns:
        try:
            c.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_certs(d):
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".crt", "-days", "2",
                "-subj", "/CN=sluice-test-" + ca, "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=kube-apiserver", cwd=d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "server.ext", cwd=d)


def main():
    global STATE
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--window", type=int, default=0, help="events kept for watches (0: all)")
    args = ap.parse_args()
    # Die with the test that started us, whatever happens to it.
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    os.makedirs(args.dir, exist_ok=True)
    make_certs(args.dir)
    token = "sluice-test-" + uuid.uuid4().hex
    with open(os.path.join(args.dir, "token"), "w") as f:
        f.write(token + "\n")
    with open(os.path.join(args.dir, "tokens"), "w") as f:
        f.write(token + "\n")
    STATE = State(args)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(args.dir, "server.crt"), os.path.join(args.dir, "server.key"))
    STATE.ssl_context = ctx
    api_up()
    admin = ThreadingHTTPServer(("127.0.0.1", 0), AdminHandler)
    admin.daemon_threads = True
    ready = {"api_port": STATE.api_port, "admin_port": admin.server_address[1], "pid": os.getpid()}
    tmp = os.path.join(args.dir, "ready.json.tmp")
    with open(tmp, "w") as f:
        json.dump(ready, f)
    os.rename(tmp, os.path.join(args.dir, "ready.json"))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    admin.serve_forever(poll_interval=0.05)


if __name__ == "__main__":
    main()
